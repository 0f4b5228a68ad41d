"""The attention registry: one decorator to register an attention, one call to name a preset, one function to build.

Every attention is an ``nn.Module`` subclass of :class:`Attention` with a ``Config`` dataclass that
holds its hyperparameters and their paper defaults::

    @dataclass
    class MyConfig:
        rank: int = 64

    @register("my_attention")
    class MyAttention(Attention):
        Config = MyConfig

        def attend(self, q, k, v, mask): ...

    register_preset("my_attention_32", "my_attention", "rank 32, as some paper's table ran it", rank=32)

    attn = build("my_attention", seq_len=1024, num_heads=2, head_dim=32, rank=16)
    attn = build("my_attention_32", seq_len=1024, num_heads=2, head_dim=32)

A preset is a named setting of a registered attention (a row of a paper's table), like timm's model
variants: ``build``, ``make_config`` and ``describe`` take a preset's name wherever they take an
attention's, with the preset's values in place of the defaults (keyword arguments still override
them). Names are unique across attentions and presets.

``build`` checks every hyperparameter against the dataclass: an unknown key or a value of the wrong
type is a ``ValueError``/``TypeError`` that lists the valid keys with their defaults. Unlike a
filter that keeps only the keys it knows, nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, Union

import torch
from torch import nn

from ._checks import check_inputs, zero_masked_queries, zero_padded_inputs

_REGISTRY: dict[str, type[Attention]] = {}
_PRESETS: dict[str, Preset] = {}


@dataclasses.dataclass
class NoHyperparameters:
    """Config of an attention that has no hyperparameters of its own."""


class Attention(nn.Module):
    """Base class of every core attention.

    The core attention maps ``q, k`` of shape ``(batch, heads, seq, head_dim)``, ``v`` of shape
    ``(batch, heads, seq, value_dim)`` (``value_dim`` may differ from ``head_dim``) and an optional
    key-padding ``mask`` of shape ``(batch, seq)`` (bool, ``True`` = real token) to an output of
    the same shape as ``v``. Contract: masked keys never contribute, masked query rows come out as
    zeros, nothing at a padded position (a NaN or an inf included) reaches a real row's output or
    gradient, any ``seq >= 1`` works, and float32/float16/bfloat16 inputs give outputs of that dtype.

    Subclasses implement :meth:`attend`; :meth:`forward` checks the inputs, zeroes the padded
    positions of q, k and v, applies the float32 policy and zeroes the masked query rows, so no
    attention repeats those rules. Class attributes:

    * ``Config``: the dataclass of hyperparameters;
    * ``in_float32 = True`` when the algorithm's arithmetic needs float32 (exponentials of large
      scores, an iterated pseudo-inverse, hashing by angle): it then runs in float32 whatever the
      input dtype and any autocast, and its output is cast back to the input dtype. The class's
      choice is the instance's default; :class:`MultiHeadAttention` sets it on the instance for every
      attention when asked to (``attention_in_float32``, as the YOSO and Nystromformer LRA code runs
      attention);
    * ``tie_query_key = True`` when the algorithm needs the query and key projections shared
      (Reformer); :class:`MultiHeadAttention` reads it;
    * ``linear_memory = False`` for an attention whose memory grows quadratically with the sequence
      (exact softmax; on the instance where it depends on the config); every other attention is
      held to linear memory by ``tests/attention_zoo/test_memory.py``;
    * ``sized_by_seq_len``: for an attention whose weights are built for ``seq_len`` positions, what
      they are ("the Linformer projections"); :meth:`forward` refuses a longer input, naming them.
    """

    Config: ClassVar[type] = NoHyperparameters
    in_float32: bool = False
    tie_query_key: ClassVar[bool] = False
    linear_memory: ClassVar[bool] = True
    sized_by_seq_len: ClassVar[str | None] = None
    name: ClassVar[str]

    def __init__(self, *, seq_len: int, num_heads: int, head_dim: int, config: Any) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.config = config

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Padded positions selected out of q, k and v; the float32 policy, in one place: cast to float32, autocast
        off, cast back; then masked rows are zeroed."""
        check_inputs(q, k, v, mask)
        if self.sized_by_seq_len and q.shape[2] > self.seq_len:
            raise ValueError(
                f"sequence length {q.shape[2]} exceeds seq_len={self.seq_len}, the length {self.sized_by_seq_len} "
                f"were built for; build the attention with seq_len >= {q.shape[2]}"
            )
        q, k, v = zero_padded_inputs(q, k, v, mask)
        if self.in_float32:
            # .float() alone is not enough: under autocast the products would still run in bfloat16.
            with torch.autocast(q.device.type, enabled=False):
                out = self.attend(q.float(), k.float(), v.float(), mask).to(v.dtype)
        else:
            out = self.attend(q, k, v, mask)
        return zero_masked_queries(out, mask)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The algorithm on checked inputs, zero at padded positions (float32 when ``in_float32``); rows of masked
        queries may hold anything."""
        raise NotImplementedError

    def extra_repr(self) -> str:
        fields = ", ".join(f"{f.name}={getattr(self.config, f.name)!r}" for f in dataclasses.fields(self.config))
        return f"seq_len={self.seq_len}, num_heads={self.num_heads}, head_dim={self.head_dim}" + (f", {fields}" if fields else "")


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named setting of a registered attention, e.g. a row of a paper's table."""

    name: str
    attention: str  # the registered attention it builds
    hparams: dict[str, Any]  # every hyperparameter of the attention, validated
    description: str


def register(name: str):
    """Class decorator that registers an :class:`Attention` subclass under ``name``."""

    def decorator(cls: type[Attention]) -> type[Attention]:
        if not (isinstance(cls, type) and issubclass(cls, Attention)):
            raise TypeError(f"@register({name!r}) must decorate a subclass of attention_zoo.Attention, got {cls!r}")
        if "float32" in vars(cls):  # the attribute's name before in_float32: ignoring it would drop the policy silently
            raise TypeError(f"{cls.__name__}.float32 is now called in_float32 (the class's choice, the instances' default)")
        if not dataclasses.is_dataclass(cls.Config):
            raise TypeError(f"{cls.__name__}.Config must be a dataclass, got {cls.Config!r}")
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"attention {name!r} is already registered by {_REGISTRY[name].__qualname__}")
        if name in _PRESETS:
            raise ValueError(f"{name!r} is already the name of a preset of {_PRESETS[name].attention!r}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorator


def register_preset(name: str, attention: str, description: str, **hparams: Any) -> Preset:
    """Name a setting of the registered ``attention``: ``build(name, ...)`` then builds it.

    ``hparams`` are validated at once (a preset that cannot build fails at import); the preset holds
    every hyperparameter, the ones not given at the attention's defaults.
    """
    if name in _REGISTRY:
        raise ValueError(f"{name!r} is already the name of a registered attention; a preset needs a name of its own")
    config = make_config(attention, **hparams)
    preset = Preset(name, attention, dataclasses.asdict(config), description)
    if name in _PRESETS and _PRESETS[name] != preset:
        raise ValueError(f"preset {name!r} is already registered, for {_PRESETS[name].attention!r}")
    _PRESETS[name] = preset
    return preset


def unregister(name: str) -> None:
    """Remove the attention or preset ``name`` (for tests that register throwaway ones)."""
    _REGISTRY.pop(name, None)
    _PRESETS.pop(name, None)


def available() -> list[str]:
    """Sorted names of every registered attention."""
    return sorted(_REGISTRY)


class Presets(dict):
    """Presets by name, a dict that prints as a list: a line per preset, its attention and what it is."""

    def __repr__(self) -> str:
        width = max(map(len, self), default=0)
        return "\n".join(f"{name:<{width}}  {preset.attention}: {preset.description}" for name, preset in self.items())


def presets() -> Presets:
    """Every registered preset by name, sorted by name."""
    return Presets(sorted(_PRESETS.items()))


def _resolve(name: str) -> tuple[str, dict[str, Any]]:
    """The attention ``name`` builds and the values in place of its defaults (a preset's)."""
    if name in _PRESETS:
        return _PRESETS[name].attention, _PRESETS[name].hparams
    if name in _REGISTRY:
        return name, {}
    names = [*_REGISTRY, *_PRESETS]
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise KeyError(f"unknown attention {name!r}.{hint} Available: {', '.join(available())}; presets: {', '.join(presets())}")


def get_class(name: str) -> type[Attention]:
    """The class that the attention or preset ``name`` builds."""
    return _REGISTRY[_resolve(name)[0]]


def describe(name: str) -> str:
    """The hyperparameters of ``name`` with their types and defaults (a preset's values), one per line."""
    attention, preset_values = _resolve(name)
    config_cls = _REGISTRY[attention].Config
    hints = typing.get_type_hints(config_cls)
    lines = [
        f"{f.name}: {_type_name(hints[f.name])} = {preset_values.get(f.name, _default(f))!r}"
        for f in dataclasses.fields(config_cls)
    ]
    if name in _PRESETS:
        lines.insert(0, f"preset of {attention!r}: {_PRESETS[name].description}")
    return "\n".join(lines) if lines else "(no hyperparameters)"


def make_config(name: str, **hparams: Any) -> Any:
    """Validate ``hparams`` against the config dataclass of ``name`` (an attention or a preset) and return the config."""
    attention, preset_values = _resolve(name)
    config_cls = _REGISTRY[attention].Config

    def valid() -> str:
        listing = describe(name) if dataclasses.fields(config_cls) else "(none: this attention takes no hyperparameters)"
        return f"Valid keys and defaults:\n{listing}"

    values = check_fields(
        config_cls,
        hparams,
        unknown=lambda keys: f"unknown hyperparameter(s) {keys} for attention {name!r}. {valid()}",
        invalid=lambda key, kind, value: (
            f"hyperparameter {key!r} of attention {name!r} must be {kind}, got {value!r} ({type(value).__name__}). {valid()}"
        ),
        renamed=lambda old, new: f"hyperparameter {old!r} of attention {name!r} is now called {new!r}; use {new}",
    )
    return config_cls(**{**preset_values, **values})


def check_fields(
    config_cls: type,
    values: Mapping[str, Any],
    *,
    unknown: Callable[[list[str]], str],
    invalid: Callable[[str, str, Any], str],
    renamed: Callable[[str, str], str] = lambda old, new: f"{old!r} is now called {new!r}",
) -> dict[str, Any]:
    """``values`` checked against the fields and types of the dataclass ``config_cls``: the one rule for every
    configuration the project reads (an attention's hyperparameters here, ``lra``'s model and protocol).

    A key the class has renamed (its ``RENAMED`` map, old name to new) is a ValueError with ``renamed(old, new)``;
    other keys the class lacks are a ValueError with the message ``unknown(sorted keys)``; a value of the wrong
    type is a TypeError with ``invalid(key, type name, value)``. An int where a float is due becomes a float; a
    bool is never an int. Ranges are the class's own ``__post_init__``."""
    old_names = getattr(config_cls, "RENAMED", {})
    if old := sorted(set(values) & set(old_names)):
        raise ValueError("; ".join(renamed(key, old_names[key]) for key in old))
    hints = typing.get_type_hints(config_cls)
    extra = sorted(set(values) - {f.name for f in dataclasses.fields(config_cls)})
    if extra:
        raise ValueError(unknown(extra))
    checked = {}
    for key, value in values.items():
        try:
            checked[key] = _coerce(value, hints[key])
        except TypeError:
            raise TypeError(invalid(key, _type_name(hints[key]), value)) from None
    return checked


def with_current_names(config_cls: type, values: Mapping[str, Any], *, old: bool = False) -> dict[str, Any]:
    """``values`` of a stored configuration of ``config_cls`` (a run record's, a checkpoint's) with the keys the class
    has renamed (its ``RENAMED`` map) under their current names; ``old=True``: under their old names, as a
    configuration's hash was computed before the rename."""
    renamed = getattr(config_cls, "RENAMED", {})
    names = {new: name for name, new in renamed.items()} if old else renamed
    return {names.get(key, key): value for key, value in values.items()}


def build(name: str, *, seq_len: int, num_heads: int, head_dim: int, **hparams: Any) -> Attention:
    """Build the registered attention or preset ``name``.

    ``seq_len``, ``num_heads`` and ``head_dim`` describe the inputs every attention will see
    (``seq_len`` is the maximum length; shorter inputs are allowed). The other keyword arguments are
    the attention's own hyperparameters, validated against its ``Config`` dataclass; for a preset
    they override its values.
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
