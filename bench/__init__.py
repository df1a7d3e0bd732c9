"""Benchmarks, run from the repository root as `python -m bench.NAME`: a package, so that they share
bench/harness.py and import each other (and `tests.reference_search`) by name."""
