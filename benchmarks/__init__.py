"""Measurements on the lab, each a module run from the checkout: `python3 -m benchmarks.suite` (and so on).
What they share to drive the lab is in benchmarks/labkit.py."""
