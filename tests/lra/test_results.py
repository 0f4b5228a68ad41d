import subprocess
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


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU on this machine")
def test_the_peak_memory_of_a_process_that_has_not_used_cuda_yet_can_be_reset():
    """A run resets the peak before its first CUDA allocation; in a fresh process that once failed
    with 'Invalid device argument' and every training run on a GPU failed with it."""
    script = (
        "import torch\n"
        "from lra.results import reset_peak_memory, peak_memory_mb\n"
        "device = torch.device('cuda', 0)\n"
        "reset_peak_memory(device)\n"
        "x = torch.ones(2**20, device=device)\n"
        "print(peak_memory_mb(device)[0])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert float(done.stdout.split()[-1]) >= 4.0  # the 4 MiB tensor
