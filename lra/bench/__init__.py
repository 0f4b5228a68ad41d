"""Benchmarks that write CSV and PNG results: ``python -m lra.bench --help`` lists them."""
