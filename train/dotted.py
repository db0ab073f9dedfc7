"""Nested mappings of dotted keys and the typed dataclasses they build: the parsing under
``train.config`` (``a.b.c=value`` overrides, YAML values coerced to each field's type hint)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

import yaml


def set_dotted(raw: dict[str, Any], item: str) -> None:
    """Apply one ``a.b.c=value`` override to nested dicts (the value is parsed as YAML)."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"override {item!r} must look like key=value, e.g. train.epochs=5")
    *parents, leaf = key.strip().split(".")
    node = raw
    for p in parents:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {item!r}: {p!r} is not a section")
    node[leaf] = yaml.safe_load(value) if value.strip() else None


def build_dataclass(cls: type, raw: Any, prefix: str) -> Any:
    """``cls`` (a dataclass, nested ones built recursively) from the mapping ``raw``: unknown keys
    and values of the wrong type are a ``ValueError`` naming the dotted key (``prefix`` + name)."""
    where = prefix.rstrip(".") or "config"
    if not isinstance(raw, dict):
        raise ValueError(f"{where} must be a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ValueError(
            f"unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(prefix + k for k in unknown)}; valid keys in {where}: {', '.join(names)}"
        )
    kwargs = {}
    for name in names:
        if name not in raw:
            continue
        hint, value, key = hints[name], raw[name], prefix + name
        if dataclasses.is_dataclass(hint):
            kwargs[name] = build_dataclass(hint, value, key + ".")
        else:
            kwargs[name] = _coerce(value, hint, key)
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{key} must be one of {args}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{key} must be a list, got {value!r}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if hint is float and isinstance(value, str):  # YAML reads "1e-3" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if hint in (int, str, bool) and type(value) is hint:
        return value
    raise ValueError(f"{key} must be {getattr(hint, '__name__', hint)}, got {value!r}")


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a.b": v}`` from ``{"a": {"b": v}}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= flatten(v, f"{prefix}{k}.")
        else:
            out[prefix + k] = v
    return out
