"""State dicts a :class:`~hostreg.torch.Stager` handed out, known by their tensors.

A staged state dict's tensors are new objects over one slot's buffer, made by hostreg with the
dtypes, shapes and strides of that slot's layout, on the CPU, without gradients, as pinned as
the buffer: what hostreg's save planner would otherwise read from each tensor at every save
(about 2.5 us a tensor, ``_checkpoint/planner.py``). The slot notes what it hands out here;
the planner asks :func:`owner_of` whether a state dict's tensors are exactly those (the same
objects, in the same structure) and then takes their properties from the slot, once per slot.
A staged tensor whose shape or strides are changed in place (``resize_``, ``as_strided_``,
``set_``) before it is saved is not detected: staged state dicts are for saving as they are.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from operator import is_
from typing import Any

import torch

_KEEP = 8  # state dicts remembered (the last few handed out)
_lock = threading.Lock()
_table: OrderedDict[int, tuple[tuple, list[weakref.ref[torch.Tensor]], weakref.ref]] = OrderedDict()


def note(spec: tuple, issued: list[weakref.ref[torch.Tensor]], owner: Any) -> None:
    """Remember that ``owner`` handed out a state dict of structure ``spec`` whose tensors are
    ``issued`` (weak references, in traversal order). Nothing here keeps the owner (its
    buffer) or the tensors alive."""
    if not issued:
        return
    first = id(issued[0]())
    with _lock:
        _table[first] = (spec, issued, weakref.ref(owner))
        _table.move_to_end(first)
        while len(_table) > _KEEP:
            _table.popitem(last=False)


def owner_of(spec: tuple, tensors: list[torch.Tensor]) -> Any:
    """The owner that handed out ``tensors`` (a state dict's, in traversal order, of structure
    ``spec``) as they are, or None."""
    if not tensors:
        return None
    with _lock:
        got = _table.get(id(tensors[0]))
    if got is None:
        return None
    noted, issued, owner = got
    if len(issued) != len(tensors) or (noted is not spec and noted != spec):
        return None
    return owner() if all(map(is_, tensors, [r() for r in issued])) else None
