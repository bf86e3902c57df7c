"""Walking a nested state dict: :func:`flatten` it into its tensors, its other
values and a spec of its structure; :func:`unflatten` builds it again from a spec.

Containers are mappings (dict, OrderedDict, any dict subclass: rebuilt as their own type
where it takes an iterable of pairs, else as dict), lists, tuples and named tuples. Every
``torch.Tensor`` (DTensor included) is a tensor leaf; anything else is a value leaf. The
spec is hashable, and two state dicts have equal specs exactly when their containers, keys
and leaf kinds match position by position (the values themselves do not count): what
staging needs to decide that a staged copy fits a source.

The walker is recursive on purpose but keeps no closure over itself (a recursive closure is
a reference cycle, which would keep staged tensors alive until the garbage collector ran).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

TENSOR = ("T",)
VALUE = ("V",)

Spec = tuple


def _walk(obj: Any, tensors: list[torch.Tensor], values: list[Any]) -> Spec:
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return TENSOR
    if isinstance(obj, dict):
        return ("D", type(obj), tuple(obj.keys()), tuple([_walk(v, tensors, values) for v in obj.values()]))
    if isinstance(obj, list):
        return ("L", tuple([_walk(v, tensors, values) for v in obj]))
    if isinstance(obj, tuple):
        return ("U", type(obj), tuple([_walk(v, tensors, values) for v in obj]))
    values.append(obj)
    return VALUE


def flatten(obj: Any) -> tuple[list[torch.Tensor], list[Any], Spec]:
    """(tensors in traversal order, other values in traversal order, spec)."""
    tensors: list[torch.Tensor] = []
    values: list[Any] = []
    return tensors, values, _walk(obj, tensors, values)


def _build(spec: Spec, tensors: Iterator[Any], values: Iterator[Any]) -> Any:
    kind = spec[0]
    if kind == "T":
        return next(tensors)
    if kind == "V":
        return next(values)
    if kind == "D":
        _, cls, keys, children = spec
        items = [(k, _build(c, tensors, values)) for k, c in zip(keys, children)]
        try:
            return cls(items)
        except TypeError:
            return dict(items)
    if kind == "L":
        return [_build(c, tensors, values) for c in spec[1]]
    _, cls, children = spec
    built = [_build(c, tensors, values) for c in children]
    return cls(*built) if hasattr(cls, "_fields") else cls(built)


def unflatten(spec: Spec, tensors: list[Any], values: list[Any]) -> Any:
    """The structure ``spec`` describes, with ``tensors`` and ``values`` in traversal order."""
    return _build(spec, iter(tensors), iter(values))


def _paths(spec: Spec, prefix: tuple, out: list[tuple]) -> None:
    kind = spec[0]
    if kind == "T":
        out.append(prefix)
    elif kind == "D":
        for k, c in zip(spec[2], spec[3]):
            _paths(c, (*prefix, k), out)
    elif kind in ("L", "U"):
        for i, c in enumerate(spec[-1]):
            _paths(c, (*prefix, i), out)


def tensor_paths(spec: Spec) -> list[tuple]:
    """The key path (keys and indices) of every tensor leaf, in traversal order."""
    out: list[tuple] = []
    _paths(spec, (), out)
    return out


def dotted(path: tuple) -> str:
    """``("opt", "state", 0, "exp_avg")`` as ``opt.state.0.exp_avg``."""
    return ".".join(map(str, path))
