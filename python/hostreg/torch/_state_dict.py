"""Fast staging: a whole state dict in one shared, registered arena.

PyTorch's shared+pinned path (``_create_cpu_state_dict(share_memory=True, pin_memory=True)``)
makes one shared-memory object, one file descriptor and one registration per tensor, and
makes them again for every save (0.1-0.3 GiB/s measured on a 2-core VM, ``docs/staging.md``).
Here a state dict gets one arena (``_arena.py``): its memory is reserved and populated up front
(so a full ``/dev/shm`` raises here, not as a SIGBUS later), registered once through the active
backend, and every tensor lives in it, each unique source storage once, with the source's view
relations (``_layout.py``). Re-staging copies into the same arena (``_copy.py``).

DTensor state dicts (FSDP2, tensor parallel) are staged by their local shards and come back as
DTensors with the same mesh, placements, global shape and strides, as DCP plans, saves and
reshards PyTorch's own copy.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from . import _sharing, _tree
from ._arena import Arena
from ._collector import collector_paused
from ._copy import CopyPlan
from ._dtensor import local_of
from ._layout import ALIGNMENT, Layout, Prepared, layout_of
from ._sources import source_key

__all__ = ["ALIGNMENT", "Arena", "StagedCopy", "copy_state_dict", "create_cpu_state_dict", "allocate_staged_copy"]


@dataclass
class StagedCopy:
    """A staged copy: ``state_dict`` (the source's structure, its tensors in ``arena``),
    ``tensors`` (its leaves, in traversal order), the ``layout`` and the span ``storages``."""

    state_dict: Any
    tensors: list[torch.Tensor]
    arena: Arena
    layout: Layout
    storages: list[torch.UntypedStorage]


def allocate_staged_copy(
    state_dict: Any, *, pin_memory: bool = True, share_memory: bool = True, prepared: Prepared | None = None
) -> StagedCopy:
    """Allocate (one arena) the staged copy of ``state_dict`` without copying values
    (``prepared``: its ``layout_of`` already computed; ``state_dict`` is then not read)."""
    layout, _, values = prepared if prepared is not None else layout_of(state_dict)
    arena = Arena(layout.nbytes, pin=pin_memory, share=share_memory)
    storages, leaves = arena.staged_leaves(layout)
    staged = _tree.unflatten(layout.spec, leaves, copy.deepcopy(values))
    return StagedCopy(staged, leaves, arena, layout, storages)


def create_cpu_state_dict(state_dict: Any, pin_memory: bool = True, share_memory: bool = True) -> Any:
    """hostreg's ``_create_cpu_state_dict``: the same structure, every tensor in one arena.

    Returns a state dict (a plain dict, or the source's own mapping type) whose tensors are
    uninitialised CPU tensors of the source's dtypes and shapes, in one arena that is shared
    (``share_memory``: other processes get it without a copy) and registered once
    (``pin_memory``). Tensors that share a storage in the source (tied weights, views) share
    one in the copy, with the same strides; conjugate or negative views become contiguous
    tensors of their values; empty tensors hold no bytes. Each tensor's storage holds its own
    bytes only, so ``torch.save`` and DCP's writers take the copy as they take PyTorch's.
    DTensors stay DTensors (same mesh, placements, global shape and strides) over staged local
    shards. Non-tensor values are deep copies. Fill it with :func:`copy_state_dict` (or
    PyTorch's ``_copy_state_dict``). The registration is undone when every tensor of it is
    gone.

    Raises :class:`hostreg.StagingError` when the memory cannot be reserved or locked (the
    message names the limit), ``TypeError`` for tensors it cannot place (ShardedTensor, sparse,
    nested, quantized; the message names the entry).
    """
    with collector_paused():
        prepared = layout_of(state_dict)
        staged = allocate_staged_copy(None, pin_memory=pin_memory, share_memory=share_memory, prepared=prepared)
        # The plan of the copy that usually follows, from these very sources: their grouping is
        # the layout's, not worked out again.
        made_for = (source_key(prepared[1]), prepared[0].grouping)
        grouping = prepared[0].grouping.as_destination()
        _plans[staged.arena.buffer] = CopyPlan(staged.tensors, weak=True, made_for=made_for, grouping=grouping)
        return staged.state_dict


# Copy plans of staged dicts, beside the arena their tensors live in (a staged dict is a plain
# dict, as PyTorch's own staged copy is, so that torch.save writes and torch.load reads it as
# one; it cannot carry the plan itself). Weak both ways: neither keeps the other alive.
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def copy_state_dict(src: Any, dst: Any, threads: int = 0) -> Any:
    """Copy every tensor of ``src`` into the tensor at the same place in ``dst``; returns ``dst``.

    ``dst`` has the structure of ``src`` (from :func:`create_cpu_state_dict`). Tensors are
    matched by key (like PyTorch's ``_copy_state_dict``). When the sources share storages as
    the destinations do and have their dtypes, shapes and strides, the copy is one memcpy per
    staged storage, all in one parallel batch (``threads`` threads; 0: one per CPU this thread
    may run on) with the GIL released; from an accelerator, one non-blocking copy per storage,
    synchronised before returning. Otherwise tensor by tensor (``Tensor.copy_``). Copying into the same staged dict
    again reuses what the first copy worked out.

    Raises ``ValueError`` when the keys or a tensor's shape differ, when a source overlaps a
    destination, or when destinations tied together (one storage) have sources that are not.
    """
    with collector_paused():
        return _copy_state_dict(src, dst, threads)


def _copy_state_dict(src: Any, dst: Any, threads: int) -> Any:
    s_list, _, s_spec = _tree.flatten(src)
    d_list, _, d_spec = _tree.flatten(dst)
    if s_spec != d_spec:  # keys in another order (go by key, as PyTorch does), or other keys
        by_path = dict(zip(_tree.tensor_paths(s_spec), s_list))
        d_paths = _tree.tensor_paths(d_spec)
        if set(by_path) != set(d_paths) or len(s_list) != len(d_list):
            missing = sorted(_tree.dotted(p) for p in set(d_paths) - set(by_path))[:3]
            extra = sorted(_tree.dotted(p) for p in set(by_path) - set(d_paths))[:3]
            raise ValueError(f"source and destination differ in structure (missing {missing}, extra {extra})")
        s_list = [by_path[p] for p in d_paths]
    arena = _sharing.staging_buffer_of(local_of(d_list[0])) if d_list else None
    plan = _plans.get(arena) if arena is not None else None
    if plan is None or plan.ids != list(map(id, d_list)) or not plan.alive():  # plan.copy checks where they live
        plan = CopyPlan(d_list, weak=True)
        if arena is not None:
            _plans[arena] = plan
    # Sources and destinations where they were, viewed as they were: the last copy's memcpy batch again.
    skey = source_key(s_list)
    plan.copy(s_list, threads, key=(skey, source_key(d_list)), src_key=skey)
    return dst
