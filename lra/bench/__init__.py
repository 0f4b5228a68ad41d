"""Benchmarks that write results into results/: ``python -m lra.bench <name> --help``."""
