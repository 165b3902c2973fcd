"""Stand-in server: the argument groups (fields declared as ``A[type, help]``)."""
