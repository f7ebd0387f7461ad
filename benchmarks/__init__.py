"""Benchmarks of fedhar (scripts: ``python benchmarks/<name>.py``) and the helpers they share."""
