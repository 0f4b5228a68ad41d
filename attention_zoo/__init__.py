"""attention_zoo: efficient attentions behind one registry.

    import attention_zoo
    attention_zoo.available()
    attn = attention_zoo.build("softmax", seq_len=4096, num_heads=2, head_dim=32)
    out = attn(q, k, v, mask)   # (batch, heads, seq, head_dim); mask (batch, seq) bool or None
    attention_zoo.presets()     # named settings, e.g. the YOSO paper's rows: build("yoso_32", ...)

Every module in this package whose name does not start with ``_`` is imported here, so dropping a
new file with an ``@register``-ed class (and its ``register_preset`` calls) into the folder is all it
takes to add an attention.
"""

import importlib
import pkgutil

from .multihead import MultiHeadAttention
from .registry import (
    Attention,
    Preset,
    available,
    build,
    check_fields,
    describe,
    get_class,
    make_config,
    presets,
    register,
    register_preset,
    unregister,
    with_current_names,
)

_INFRASTRUCTURE = {"registry", "multihead", "rotary"}

for _module in pkgutil.iter_modules(__path__):
    if not _module.name.startswith("_") and _module.name not in _INFRASTRUCTURE:
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "Attention",
    "MultiHeadAttention",
    "Preset",
    "available",
    "build",
    "describe",
    "get_class",
    "check_fields",
    "make_config",
    "presets",
    "register",
    "register_preset",
    "unregister",
    "with_current_names",
]
