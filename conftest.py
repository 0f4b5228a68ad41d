"""Settings for every test process.

Under pytest-xdist (``pytest -n auto``), each worker and each process a test starts (``lra.train``,
the benchmarks) gets its share of the cores as torch threads (OMP_NUM_THREADS), not torch's default
of all of them, so that the workers do not fight over the cores. Set before torch is imported, and
inherited by subprocesses through the environment; a test that needs more threads sets them itself.

This file sits in the repository's root, not in tests/, on purpose: pytest puts a conftest's folder
first on sys.path, and in tests/ the folder tests/attention_zoo (no __init__.py) would then be
imported as an empty namespace package in place of the real attention_zoo.
"""

import os

if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
