"""Shared by the attention tests: seeded random inputs, a ragged padding mask, the dense float64 softmax reference,
and a recorder of the largest allocation.

Imported as ``from zoo_inputs import ...``: tests/attention_zoo has no ``__init__.py`` (a package there would
shadow the real ``attention_zoo``), so pytest puts this folder on ``sys.path`` before it imports a test file
from it, as tests/lra's files import ``tiny_listops``. The name does not start with ``test_``, so pytest does
not collect it.

Every helper is deterministic: the random ones draw from their own ``torch.Generator``, never the global RNG,
so a test gets the same numbers whatever ran before it, in any process (``pytest -n auto``).
"""

import functools
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import attention_zoo

HEADS, HEAD_DIM = 2, 8  # the default shape of the per-family tests' attentions and inputs


def build_attention(name, seq_len, **hparams):
    """``attention_zoo.build(name)`` with ``HEADS`` heads of width ``HEAD_DIM``, in eval mode (no dropout)."""
    return attention_zoo.build(name, seq_len=seq_len, num_heads=HEADS, head_dim=HEAD_DIM, **hparams).eval()


def builder(name):
    """``build(seq_len, **hparams)`` for one attention: ``build_attention`` with the name filled in."""
    return functools.partial(build_attention, name)


def random_qkv(batch, n, *, seed=0, dtype=torch.float32, value_dim=None, heads=HEADS, head_dim=HEAD_DIM, qk_scale=1.0):
    """Standard normal ``(q, k, v)``: q and k of shape (batch, heads, n, head_dim), v of (batch, heads, n, value_dim).

    Drawn in that order from one generator seeded ``seed``, directly in ``dtype`` (a float64 draw is not a
    float32 one cast up). ``value_dim`` defaults to ``head_dim``, so by default the three are equally wide;
    ``qk_scale`` multiplies q and k (not v).
    """
    generator = torch.Generator().manual_seed(seed)
    q, k = (qk_scale * torch.randn(batch, heads, n, head_dim, generator=generator, dtype=dtype) for _ in range(2))
    v = torch.randn(batch, heads, n, head_dim if value_dim is None else value_dim, generator=generator, dtype=dtype)
    return q, k, v


def random_values(batch, n, value_dim, *, seed, heads=HEADS):
    """Float32 standard normal values of shape (batch, heads, n, value_dim) from their own generator seeded ``seed``:
    a v of another width to go with the q and k of ``random_qkv``."""
    return torch.randn(batch, heads, n, value_dim, generator=torch.Generator().manual_seed(seed))


def ragged_mask(n, row3=1):
    """A (4, n) key padding mask (True = real token), each sequence with its own valid tokens.

    Row 0 unpadded; row 1 random padding (each token real with probability 0.7, from a generator seeded 1);
    row 2 fully padded; row 3 real on its first ``row3`` tokens only (right padded after them; the default,
    1, is only its first token), or with ``row3="last"`` on its last token only.
    """
    mask = torch.rand(4, n, generator=torch.Generator().manual_seed(1)) < 0.7
    mask[0] = True
    mask[2] = False
    mask[3] = False
    if row3 == "last":
        mask[3, -1] = True
    else:
        mask[3, :row3] = True
    return mask


def same_block(n, block_size):
    """(n, n) bool: query i and key j lie in the same block of ``block_size`` consecutive tokens."""
    block = torch.arange(n) // block_size
    return block[:, None] == block[None, :]


def softmax_reference(q, k, v, mask=None, allowed=None):
    """softmax(q k^T / sqrt(d)) v in float64, dense, over the real keys and the pattern ``allowed``.

    ``mask``: (b, n) bool, True = real token, or None; a padded key gets no weight and a padded query's row
    is zero. ``allowed``: a bool pattern broadcast against the (b, h, n_q, n_k) scores, e.g. (n, n) or
    (h, n, n), or None for every pair. A query with no key to see (fully padded, or an empty pattern row)
    gets zeros, not NaN.
    """
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (b, h, n_q, n_k)
    keep = allowed
    if mask is not None:
        real_keys = mask[:, None, None, :]
        keep = real_keys if keep is None else keep & real_keys
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    out = torch.nan_to_num(scores.softmax(-1)) @ v  # a row with no key to see has no softmax: NaN -> 0
    return out if mask is None else out * mask[:, None, :, None]


def attend64(attn, q, k, v, mask):
    """The algorithm itself, ``attn.attend``, which unlike ``forward`` takes float64 inputs; padded query rows
    zeroed, as ``forward`` zeroes them."""
    out = attn.attend(q, k, v, mask)
    return out if mask is None else out * mask[:, None, :, None]


def influence(attn, q, k, v):
    """(n, n) bool: (i, j) is True when adding 10 to key j and value j changes output row i of the first sequence
    in any head or feature (compared with ``!=``: any change at all counts)."""
    n = q.shape[2]
    reference = attn(q, k, v)
    result = torch.zeros(n, n, dtype=torch.bool)
    for j in range(n):
        k2, v2 = k.clone(), v.clone()
        k2[:, :, j] += 10.0
        v2[:, :, j] += 10.0
        result[:, j] = (attn(q, k2, v2) != reference).any(dim=-1).any(dim=1)[0]  # over heads and features
    return result


class LargestAllocation(TorchDispatchMode):
    """Records the largest storage (in elements) any operator returns while active, forward and backward.

    The backward of CPU tensors runs on this thread, so it is seen too. Views share their base's storage:
    an ``expand`` to n x n costs nothing and counts nothing. ``operator`` names the operator that returned it.
    """

    def __init__(self):
        super().__init__()
        self.largest = 0  # elements of the largest storage produced by any operator
        self.operator = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.device.type != "meta":
                elements = tensor.untyped_storage().nbytes() // tensor.element_size()
                if elements > self.largest:
                    self.largest, self.operator = elements, str(func)
        return out


def forward_backward_allocation(attn, q, k, v, mask=None):
    """``(elements, operator)``: the largest storage any operator returns in ``attn(q, k, v, mask)`` and the backward
    of the sum of its squares, and the operator that returned it (``LargestAllocation``). q, k and v should
    require grad, so that the backward computes their gradients too."""
    with LargestAllocation() as record:
        attn(q, k, v, mask).square().sum().backward()
    return record.largest, record.operator
