"""One YOSO layer's training step on the CUDA path, run on the emulated kernels (yoso_cuda.emulator).

Under ``Emulator.cuda_path()`` yoso_cuda's Python glue takes the branch it takes for CUDA tensors
(randomness drawn on the device, the compiled ops) with CPU tensors and the emulated CUDA kernels,
so these tests pin, without a GPU, what a GPU would run per layer:

* nothing synchronises the host: no ``.cpu()``, ``.item()``, ``.tolist()``, tensor truth values or
  numbers, and no copy between host and device (every tensor is made on its device) anywhere in the
  Python glue, custom ops and their backward included; the .cu source calls nothing that would;
* the launches of the project's kernels and CUB's sorts, counted by the emulator, and the torch ops
  of the glue, counted by a dispatch trace, may not grow: lower the pinned numbers as kernels fuse.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import yoso_cuda
from yoso_cuda import attention, emulator

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="the emulator compiles the kernels with a C++ compiler")

# ListOps' YOSO-32 layer (batch x heads = 64, n = 2048, d = 32, m = 32, tau = 11) shrunk to B = 2,
# n = 256 for the emulator: long enough for a bucket of more than the weighted cumulations' heavy
# threshold (255 rows at w = c = 32), so every launch the real shape makes is made here too.
SHAPE = dict(batch=2, length=256, dim=32, num_hashes=32, hash_bits=11)

# Per layer and training step (forward + lower_bound backward), measured at SHAPE: hashing 2 (queries,
# keys), the forward's cumulation 3 (index, heavy-bucket sums, lookup), the backward's
# lsh_lower_bound_gradients 3 (queries and keys indexed in one launch, both directions' heavy-bucket
# tables in one, both directions' lookups in one, writing grad Q, grad K and grad V). Lower these as
# kernels fuse; a change that raises them fails here.
LAUNCHES_PER_LAYER = 8  # the project's kernels (emulator's counter)
SORTS_PER_LAYER = 0  # CUB radix sorts (each several launches on a GPU): the counting sort needs none
GLUE_OPS_PER_LAYER = 16  # torch ops of the Python glue (dispatch trace), the YOSO ops included


@pytest.fixture(scope="module")
def emulated():
    return emulator.build(emulator.CUDA_SOURCE, sanitize=False)  # the emulated suite's build, shared in one process


def layer_inputs(seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    b, n, d = SHAPE["batch"], SHAPE["length"], SHAPE["dim"]
    unit = lambda: torch.nn.functional.normalize(torch.randn(b, n, d, generator=generator), dim=-1)  # noqa: E731
    anchor = unit()
    queries = anchor.requires_grad_()
    keys = torch.nn.functional.normalize(anchor.detach() + 0.5 * unit(), dim=-1).requires_grad_()
    values = torch.randn(b, n, d, generator=generator).requires_grad_()
    mask = torch.rand(b, n, generator=generator) < 0.9
    return queries, keys, values, mask


def layer_step(queries, keys, values, mask, backward: str = "lower_bound"):
    """What attention_zoo's YOSO layer runs: fresh hashes, the attention op, its backward."""
    query_codes, key_codes = yoso_cuda.hash_queries_and_keys(
        queries.detach(), keys.detach(), SHAPE["num_hashes"], SHAPE["hash_bits"]
    )
    out = yoso_cuda.lsh_attention(queries, keys, values, mask, query_codes, key_codes, SHAPE["hash_bits"], backward)
    out.backward(torch.ones_like(out))
    return out


class HostSyncRecorder:
    """Records every Python-level call that synchronises the host with the device or copies between
    them, wherever it runs (custom ops and autograd's backward included: the methods are patched)."""

    METHODS = ("cpu", "item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "cuda")

    def __init__(self, monkeypatch):
        self.calls: list[str] = []
        for name in self.METHODS:
            self._wrap_method(monkeypatch, name, lambda *args, _name=name, **kwargs: _name)
        self._wrap_method(monkeypatch, "to", self._device_target)
        self._wrap_method(monkeypatch, "copy_", self._cross_device_copy)
        for name in ("tensor", "as_tensor", "from_numpy"):  # host data made into a tensor: a host-to-device copy on a GPU
            original = getattr(torch, name)

            def factory(*args, _original=original, _name=name, **kwargs):
                self.calls.append(f"torch.{_name}")
                return _original(*args, **kwargs)

            monkeypatch.setattr(torch, name, factory)

    def _wrap_method(self, monkeypatch, name, describe):
        original = getattr(torch.Tensor, name)

        def method(tensor, *args, **kwargs):
            what = describe(tensor, *args, **kwargs)
            if what:
                self.calls.append(f"Tensor.{what}")
            return original(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, method)

    @staticmethod
    def _device_target(tensor, *args, **kwargs):
        # On the CUDA path every tensor is made on its device: a .to() naming a device (or another
        # tensor's) is a copy between host and device, pageable and so blocking from the host.
        targets = [a for a in args if isinstance(a, (torch.device, str, torch.Tensor))]
        return "to(device)" if targets or kwargs.get("device") is not None else ""

    @staticmethod
    def _cross_device_copy(tensor, source, *args, **kwargs):
        return "copy_(from another device)" if source.device != tensor.device else ""


@pytest.mark.parametrize("backward", yoso_cuda.BACKWARD_ESTIMATORS)
@pytest.mark.parametrize("projection", ["hadamard", "gaussian"])
def test_the_cuda_path_never_synchronises_the_host(emulated, monkeypatch, backward, projection):
    queries, keys, values, mask = layer_inputs()
    recorder = HostSyncRecorder(monkeypatch)
    with emulated.cuda_path():
        query_codes, key_codes = yoso_cuda.hash_queries_and_keys(
            queries.detach(), keys.detach(), SHAPE["num_hashes"], SHAPE["hash_bits"], projection
        )
        out = yoso_cuda.lsh_attention(queries, keys, values, mask, query_codes, key_codes, SHAPE["hash_bits"], backward)
        out.backward(torch.ones_like(out))
    assert recorder.calls == [], f"the CUDA path synchronises the host: {Counter(recorder.calls)}"
    assert queries.grad is not None and keys.grad is not None and values.grad is not None


def test_the_recorder_sees_what_would_synchronise(monkeypatch):
    """The recorder is not blind: the CPU path's draw (on the host, then .to(device)) and the usual
    culprits inside a custom op are caught."""
    recorder = HostSyncRecorder(monkeypatch)
    yoso_cuda.reference.random_signs(2, 8, 4, 3, "cpu", on_device=False)
    x = torch.ones(3)
    x.sum().item()
    bool(x.any())
    x.cpu()
    x.to("cpu")
    torch.empty(3).copy_(x)  # same device: not a copy between host and device
    assert Counter(recorder.calls) == Counter({"Tensor.to(device)": 2, "Tensor.item": 1, "Tensor.__bool__": 1, "Tensor.cpu": 1})


def test_the_cuda_sources_call_nothing_that_synchronises_the_host():
    """The kernels' host code: no copy to the host, no value read back, no synchronisation."""
    source = emulator.CUDA_SOURCE.read_text()
    code = "\n".join(line.split("//")[0] for line in source.splitlines())
    forbidden = [
        r"\.cpu\(\)",
        r"\.item\b",
        r"\.tolist\b",
        r"at::kCPU",
        r"cudaDeviceSynchronize",
        r"cudaStreamSynchronize",
        r"cudaEventSynchronize",
        r"cudaMemcpy\s*\(",
        r"\.to\(\s*(?:at::)?(?:Device|kCPU)",
    ]
    found = [pattern for pattern in forbidden if re.search(pattern, code)]
    assert found == [], f"{emulator.CUDA_SOURCE.name} synchronises the host: {found}"


class OpTrace(TorchDispatchMode):
    """The torch ops the Python glue dispatches, looking inside yoso::lsh_attention and its backward
    (custom ops whose Python bodies are the glue); the compiled ops count as one each."""

    GLUE = {"lsh_attention": attention.lsh_attention, "lsh_attention_backward": attention.lsh_attention_backward}

    def __init__(self):
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if func.namespace == "yoso" and name in self.GLUE:
            with self:  # the body's ops are the glue's: trace them too
                return self.GLUE[name]._init_fn(*args, **kwargs)
        self.ops[f"{func.namespace}::{name}"] += 1
        return func(*args, **kwargs)


def test_launches_and_ops_per_layer_are_pinned(emulated):
    inputs = layer_inputs()
    with emulated.cuda_path():
        layer_step(*inputs)  # warm: anything done once per process is not per layer
        inputs = layer_inputs(1)
        before = emulated.statistics()
        with OpTrace() as trace:
            layer_step(*inputs)
        after = emulated.statistics()
    launches, sorts = after["launches"] - before["launches"], after["sorts"] - before["sorts"]
    glue_ops = sum(trace.ops.values())
    counts = f"{launches} launches, {sorts} sorts, {glue_ops} glue ops {dict(trace.ops)}"
    assert launches <= LAUNCHES_PER_LAYER, f"more kernel launches per YOSO layer than pinned: {counts}"
    assert sorts <= SORTS_PER_LAYER, f"more radix sorts per YOSO layer than pinned: {counts}"
    assert glue_ops <= GLUE_OPS_PER_LAYER, f"more torch ops per YOSO layer than pinned: {counts}"
    # Pinned exactly, so that a saving is written down here (and then guarded) rather than lost.
    assert (launches, sorts, glue_ops) == (LAUNCHES_PER_LAYER, SORTS_PER_LAYER, GLUE_OPS_PER_LAYER), counts
