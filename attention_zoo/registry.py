"""The attention registry: one decorator to register, one function to build.

Every attention is an ``nn.Module`` subclass of :class:`Attention` with a ``Config`` dataclass that
holds its hyperparameters and their paper defaults::

    @dataclass
    class MyConfig:
        rank: int = 64

    @register("my_attention")
    class MyAttention(Attention):
        Config = MyConfig

        def forward(self, q, k, v, mask=None): ...

    attn = build("my_attention", seq_len=1024, num_heads=2, head_dim=32, rank=32)

``build`` checks every hyperparameter against the dataclass: an unknown key or a value of the wrong
type is a ``ValueError``/``TypeError`` that lists the valid keys with their defaults. Unlike a
filter that keeps only the keys it knows, nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, ClassVar, Literal, Union

import torch
from torch import nn

_REGISTRY: dict[str, type[Attention]] = {}


@dataclasses.dataclass
class NoHyperparameters:
    """Config of an attention that has no hyperparameters of its own."""


class Attention(nn.Module):
    """Base class of every core attention.

    The core attention maps ``q, k`` of shape ``(batch, heads, seq, head_dim)``, ``v`` of shape
    ``(batch, heads, seq, value_dim)`` (``value_dim`` may differ from ``head_dim``) and an optional
    key-padding ``mask`` of shape ``(batch, seq)`` (bool, ``True`` = real token) to an output of
    the same shape as ``v``. Contract: masked keys never contribute, masked query rows come out as
    zeros, any ``seq >= 1`` works, and float32/float16/bfloat16 inputs give outputs of that dtype.

    Subclasses set ``Config`` and may set ``tie_query_key = True`` when the algorithm needs the
    query and key projections shared (Reformer); :class:`MultiHeadAttention` reads it. An attention
    whose memory grows quadratically with the sequence (exact softmax) sets ``linear_memory = False``
    (on the instance where it depends on the config); every other attention is held to linear memory
    by ``tests/attention_zoo/test_memory.py``.
    """

    Config: ClassVar[type] = NoHyperparameters
    tie_query_key: ClassVar[bool] = False
    linear_memory: ClassVar[bool] = True
    name: ClassVar[str]

    def __init__(self, *, seq_len: int, num_heads: int, head_dim: int, config: Any) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.config = config

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self.config, f.name)!r}" for f in dataclasses.fields(self.config))
        return f"seq_len={self.seq_len}, num_heads={self.num_heads}, head_dim={self.head_dim}" + (
            f", {fields}" if fields else ""
        )


def register(name: str):
    """Class decorator that registers an :class:`Attention` subclass under ``name``."""

    def decorator(cls: type[Attention]) -> type[Attention]:
        if not (isinstance(cls, type) and issubclass(cls, Attention)):
            raise TypeError(f"@register({name!r}) must decorate a subclass of attention_zoo.Attention, got {cls!r}")
        if not dataclasses.is_dataclass(cls.Config):
            raise TypeError(f"{cls.__name__}.Config must be a dataclass, got {cls.Config!r}")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"attention {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (for tests that register throwaway attentions)."""
    _REGISTRY.pop(name, None)


def available() -> list[str]:
    """Sorted names of every registered attention."""
    return sorted(_REGISTRY)


def get_class(name: str) -> type[Attention]:
    try:
        return _REGISTRY[name]
    except KeyError:
        close = difflib.get_close_matches(name, _REGISTRY, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown attention {name!r}.{hint} Available: {', '.join(available())}") from None


def describe(name: str) -> str:
    """The hyperparameters of ``name`` with their types and defaults, one per line."""
    config_cls = get_class(name).Config
    hints = typing.get_type_hints(config_cls)
    lines = [f"{f.name}: {_type_name(hints[f.name])} = {_default(f)!r}" for f in dataclasses.fields(config_cls)]
    return "\n".join(lines) if lines else "(no hyperparameters)"


def make_config(name: str, **hparams: Any) -> Any:
    """Validate ``hparams`` against the config dataclass of ``name`` and return the config."""
    config_cls = get_class(name).Config
    hints = typing.get_type_hints(config_cls)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(hparams) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown hyperparameter(s) {unknown} for attention {name!r}. Valid keys and defaults:\n"
            + (describe(name) if fields else "(none: this attention takes no hyperparameters)")
        )
    values = {}
    for key, value in hparams.items():
        try:
            values[key] = _coerce(value, hints[key])
        except TypeError:
            raise TypeError(
                f"hyperparameter {key!r} of attention {name!r} must be {_type_name(hints[key])}, "
                f"got {value!r} ({type(value).__name__}). Valid keys and defaults:\n{describe(name)}"
            ) from None
    return config_cls(**values)


def build(name: str, *, seq_len: int, num_heads: int, head_dim: int, **hparams: Any) -> Attention:
    """Build the registered attention ``name``.

    ``seq_len``, ``num_heads`` and ``head_dim`` describe the inputs every attention will see
    (``seq_len`` is the maximum length; shorter inputs are allowed). The other keyword arguments are
    the attention's own hyperparameters, validated against its ``Config`` dataclass.
    """
    for key, value in (("seq_len", seq_len), ("num_heads", num_heads), ("head_dim", head_dim)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{key} must be a positive int, got {value!r}")
    config = make_config(name, **hparams)
    return get_class(name)(seq_len=seq_len, num_heads=num_heads, head_dim=head_dim, config=config)


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return "<required>"


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(option) for option in typing.get_args(tp))
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any) -> Any:
    """Return ``value`` as type ``tp`` (int -> float is allowed), or raise TypeError."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        for option in typing.get_args(tp):
            try:
                return _coerce(value, option)
            except TypeError:
                continue
        raise TypeError
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise TypeError
    if tp is type(None):
        if value is None:
            return None
        raise TypeError
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise TypeError
