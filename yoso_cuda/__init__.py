"""yoso_cuda: YOSO's hashing, LSH cumulations and differentiable LSH attention as torch ops.

The public interface (what ``attention_zoo`` uses):

* :func:`lsh_attention`: the differentiable ``yoso::lsh_attention`` op, YOSO-m's cumulation with
  YOSO's ``lower_bound`` or *YOSO's ``exact`` gradient estimators (:mod:`yoso_cuda.attention`);
* :func:`hash_queries_and_keys`: fresh hash functions drawn from torch's RNG and the codes of
  queries and keys under them;
* :func:`expected_collisions`: YOSO-E's collision probabilities ``(1 - arccos(q . k)/pi)^tau``;
* the raw ops (:func:`hash_codes`, :func:`lsh_cumulation`, ...), each with a ``backend`` argument:
  ``"auto"`` (compiled kernels where built), ``"compiled"`` or ``"reference"`` (pure PyTorch);
* :func:`softmax_dropout_attention`: exact softmax attention with dropout, fused on the CPU, over every key or
  Longformer's band and global tokens (the softmax baseline's training path and Longformer's CPU path,
  :mod:`yoso_cuda.softmax`);
* :func:`sequence_conv`: the depthwise convolution of the values along the sequence that YOSO-C and Nystromformer
  add, compiled for the CPU (:mod:`yoso_cuda.conv`);
* :func:`dropout_add`: dropout with the residual sum after it, fused on the CPU (the LRA model's dropout between
  its layers, :mod:`yoso_cuda.dropout`);
* :func:`expectation_attention`: YOSO-E's attention with its lower-bound gradient, fused on the CPU without the
  padding's work (:mod:`yoso_cuda.expectation`);
* :func:`chunked_attention`: Reformer's attention within chunks of LSH-sorted tokens, fused on the CPU without the
  padding's work (:mod:`yoso_cuda.chunked`);
* :func:`kernels`: build or load the compiled kernels and report what is available.

``python -m yoso_cuda`` builds the kernels and reports; ``python -m yoso_cuda --check`` compares
every compiled op with the reference on every available device.
"""

from .attention import BACKWARD_ESTIMATORS, lsh_attention
from .build import BuildReport, KernelBuildError
from .chunked import chunked_attention
from .conv import sequence_conv
from .dropout import dropout_add
from .expectation import expectation_attention
from .ops import (
    BACKENDS,
    has_kernel,
    hash_codes,
    hash_queries_and_keys,
    kernels,
    lsh_collided_gradient,
    lsh_cumulation,
    lsh_lower_bound_gradients,
    lsh_weighted_cumulation,
    lsh_weighted_cumulation_both,
)
from .reference import expected_collisions
from .softmax import softmax_dropout_attention

__all__ = [
    "BACKENDS",
    "BACKWARD_ESTIMATORS",
    "BuildReport",
    "KernelBuildError",
    "chunked_attention",
    "dropout_add",
    "expectation_attention",
    "expected_collisions",
    "has_kernel",
    "hash_codes",
    "hash_queries_and_keys",
    "kernels",
    "lsh_attention",
    "lsh_collided_gradient",
    "lsh_cumulation",
    "lsh_lower_bound_gradients",
    "lsh_weighted_cumulation",
    "lsh_weighted_cumulation_both",
    "sequence_conv",
    "softmax_dropout_attention",
]
