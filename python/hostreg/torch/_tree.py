"""Walking a nested state dict: :func:`flatten` it into its tensors, its other
values and a spec of its structure; :func:`unflatten` builds it again from a spec.

Containers are mappings (dict, OrderedDict, any dict subclass: rebuilt as their own type
where it takes an iterable of pairs, else as dict), lists, tuples and named tuples. Every
``torch.Tensor`` (DTensor included) is a tensor leaf; anything else is a value leaf. The
spec is hashable, and two state dicts have equal specs exactly when their containers, keys
(with their types, where a dict has keys that are not all ``str``: ``{True: t}`` and
``{1: t}`` differ although ``True == 1``) and leaf kinds match position by position (the
values themselves do not count): what staging needs to decide that a staged copy fits a
source, and the save planner that a plan fits a state dict.

The walker is recursive on purpose but keeps no closure over itself (a recursive closure is
a reference cycle, which would keep staged tensors alive until the garbage collector ran).
"""

from __future__ import annotations

import functools
from itertools import repeat
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
        children = list(obj.values())
        keys = tuple(obj.keys())
        if all(map(isinstance, children, repeat(torch.Tensor))):  # a dict of tensors: no frame per tensor
            tensors += children
            return ("D", type(obj), keys, _tensors(len(children)), _key_types(keys))
        return ("D", type(obj), keys, tuple([_walk(v, tensors, values) for v in children]), _key_types(keys))
    if isinstance(obj, list):
        return ("L", tuple([_walk(v, tensors, values) for v in obj]))
    if isinstance(obj, tuple):
        return ("U", type(obj), tuple([_walk(v, tensors, values) for v in obj]))
    values.append(obj)
    return VALUE


_STR = {str}


def _key_types(keys: tuple) -> tuple | None:
    """None for keys that are all ``str`` (the usual case; about 30 ns a key), else each key's
    type: equal keys of other types (``True``, ``1``, ``1.0``) make other structures."""
    return None if set(map(type, keys)) <= _STR else tuple(map(type, keys))


@functools.lru_cache(maxsize=256)
def _tensors(n: int) -> tuple:
    """The children's specs of a container of ``n`` tensors (one tuple per length, shared)."""
    return (TENSOR,) * n


def flatten(obj: Any) -> tuple[list[torch.Tensor], list[Any], Spec]:
    """(tensors in traversal order, other values in traversal order, spec)."""
    tensors: list[torch.Tensor] = []
    values: list[Any] = []
    return tensors, values, _walk(obj, tensors, values)


def _build(spec: Spec, tensors: list[Any], values: list[Any], at: list[int]) -> Any:
    """The structure ``spec`` describes, from ``tensors[at[0]:]`` and ``values[at[1]:]``
    (``at`` advances past what it takes)."""
    kind = spec[0]
    if kind == "T":
        at[0] += 1
        return tensors[at[0] - 1]
    if kind == "V":
        at[1] += 1
        return values[at[1] - 1]
    if kind == "D":
        _, cls, keys, children, _ = spec
        if children is _tensors(len(children)):  # a dict of tensors, as flatten saw it: one slice
            i = at[0]
            at[0] = i + len(keys)
            items: Any = zip(keys, tensors[i : at[0]])
        else:
            items = [(k, _build(c, tensors, values, at)) for k, c in zip(keys, children)]
        if cls is dict:
            return dict(items)
        items = list(items)
        try:
            return cls(items)
        except TypeError:
            return dict(items)
    if kind == "L":
        return [_build(c, tensors, values, at) for c in spec[1]]
    _, cls, children = spec
    built = [_build(c, tensors, values, at) for c in children]
    return cls(*built) if hasattr(cls, "_fields") else cls(built)


def unflatten(spec: Spec, tensors: list[Any], values: list[Any]) -> Any:
    """The structure ``spec`` describes, with ``tensors`` and ``values`` in traversal order."""
    return _build(spec, tensors, values, [0, 0])


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
