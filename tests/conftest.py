"""What every test process shares: its share of the machine's cores."""

import os


def pytest_configure(config):
    """Under pytest-xdist each worker gets an equal share of the cores for torch's threads, and so do the processes its
    tests start (through OMP_NUM_THREADS): on 2 cores, 2 workers of 2 threads each made OpenMP's threads wait on each
    other (scikit-learn's conftest divides its cores the same way). A value the user set is kept."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None:
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    threads = os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cores // int(workers))))
    os.environ.setdefault("MKL_NUM_THREADS", threads)
    import torch

    torch.set_num_threads(int(threads))
