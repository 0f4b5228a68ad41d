"""The emulator reports each way a kernel can break CUDA's execution model (kernels in emulator_faults.cu)."""

import shutil
from pathlib import Path

import pytest
import torch

from yoso_cuda import emulator

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="the emulator compiles kernels with a C++ compiler")


def fault_kernels():  # built once: emulator.build caches
    return emulator.build(
        Path(__file__).with_name("emulator_faults.cu"),
        namespace="yoso_emu_faults",
        schemas=("fault(Tensor x, int which) -> Tensor",),
    )


@pytest.fixture(scope="module")
def fault():
    built = fault_kernels()
    return lambda which: built.ops.fault(torch.arange(64, dtype=torch.float32), which)


@pytest.mark.parametrize(
    "which, report",
    [
        (0, "divergent __syncthreads: thread"),
        (
            1,
            r"exited while \d+ thread\(s\) wait at __syncthreads \(line \d+\)"
            r"|reached by thread .* after 1 thread\(s\) of the block exited",
        ),
        (2, r"mismatched warp collectives in warp \d: thread .* calls __shfl(_xor)?_sync \(line \d+\)"),
        (3, "lane 3, which has exited|exited while lanes .* wait for it in __shfl_sync"),
        (4, r"reads lane 20 in __shfl_sync \(line \d+\), outside the mask 0xffff"),
        (5, "does not name its own lane"),
        (7, r"128 threads per block, more than the kernel's __launch_bounds__\(64\)"),
        (8, "2048 threads per block, more than sm_90's 1024"),
        (9, r"grid dimension 0 = 0 outside sm_90's \[1, 2147483647\] \(an empty grid is an invalid configuration\)"),
        (10, r"grid dimension 1 = 70000 outside sm_90's \[1, 65535\]"),
        (11, "65536 bytes of dynamic shared memory, more than sm_90's 49152"),
        (12, "65536 bytes of static and 0 of dynamic shared memory, more than sm_90's 49152"),
        (13, "has bits at or above end_bit = 4, which the radix sort ignores"),
    ],
)
def test_each_fault_is_reported_with_where_it_happened(fault, which, report):
    for order, seed in emulator.SCHEDULES:
        with fault_kernels().schedule(order, seed), pytest.raises(RuntimeError, match=report) as error:
            fault(which)
        assert "CUDA emulator" in str(error.value)


def test_a_race_on_shared_memory_changes_the_result_between_schedules(fault):
    """Thread t reads slot t + 1 without a barrier: forward order reads the poison, reverse the value."""
    results = []
    for order, seed in emulator.SCHEDULES:
        with fault_kernels().schedule(order, seed):
            results.append(fault(6))
    assert torch.isnan(results[0][:-1]).all()  # 0xFF bytes read as a float: NaN
    assert torch.equal(results[1][:-1], torch.arange(1, 64, dtype=torch.float32))
    assert not torch.equal(results[0], results[1])
