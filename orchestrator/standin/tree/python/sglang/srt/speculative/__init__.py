"""Speculative decoding in the stand-in server (a skeleton for patches to land in)."""
