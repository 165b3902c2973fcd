"""The stand-in's ``sglang.srt`` runtime package (arguments, HTTP front end, a worker)."""
