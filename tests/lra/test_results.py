import sys

import numpy as np
import pytest
import torch

from lra import results


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the peak resident set is read from Linux's /proc")
def test_each_run_of_a_multirun_reports_its_own_peak_memory():
    """Hydra's multirun trains every job in one process: a peak left by an earlier job must not
    become a later job's figure."""
    cpu = torch.device("cpu")
    results.reset_peak_memory(cpu)
    before, kind = results.peak_memory_mb(cpu)
    block = np.ones(400 * 2**20 // 8)  # 400 MB, touched, then freed (glibc unmaps a block this large)
    during, _ = results.peak_memory_mb(cpu)
    del block
    results.reset_peak_memory(cpu)
    after, _ = results.peak_memory_mb(cpu)
    assert kind == "cpu_max_rss"
    assert during > before + 350, (before, during)
    assert after < during - 350, (during, after)
