"""Where each tensor of a state dict goes in its arena.

Tensors that share a storage (tied weights, views, slices of one parameter) are staged once,
with the same view relations: every source storage becomes one *span* of the arena holding
the bytes its tensors touch, and each tensor a view of its span with the source's offset,
shape and strides. So the bytes staged are the unique bytes, and a copy is one memcpy per
span. Spans start at multiples of :data:`ALIGNMENT` (256 bytes: any element size divides
it, a cache line and an AVX-512 vector fit, and CUDA's allocator aligns device buffers so,
so copy engines see no misaligned starts), in the order their first tensor appears.

A DTensor (FSDP2, tensor parallel) is staged by its local shard; a conjugate or negative view,
or a view whose elements alias one another (an expanded tensor), gets a contiguous span of
its own (its values resolved), so that ``Tensor.copy_`` can write it. So does a meta tensor
(deferred init): meta tensors have no storage to tell apart, and each gets bytes of its own,
as with PyTorch's ``_create_cpu_state_dict``; copying *from* one raises torch's own
``NotImplementedError`` ("no data"). Empty tensors take no bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from . import _tree
from ._dtensor import dtensor_type, local_of, placement_of

ALIGNMENT = 256
# Span starts inside a source storage are rounded down to this many bytes, a multiple of
# every element size, so every tensor of the span starts at a whole element of its dtype.
_ELEMENT = 16


def check_leaf(path: tuple, t: torch.Tensor) -> None:
    """TypeError, naming the entry, for tensors staging cannot place."""
    where = _tree.dotted(path)
    dtensor = dtensor_type()
    if dtensor is not None and isinstance(t, dtensor):
        t = local_of(t)
    elif type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        if type(t).__name__ == "ShardedTensor":
            raise TypeError(
                f"{where}: hostreg staging takes tensors and DTensors, not ShardedTensor "
                "(use DTensor state dicts: torch.distributed.checkpoint.state_dict.get_state_dict)"
            )
        raise TypeError(f"{where}: hostreg staging takes plain tensors and DTensors, not {type(t).__name__}")
    if t.is_nested:
        raise TypeError(f"{where}: hostreg staging takes plain tensors, not nested tensors")
    if t.layout != torch.strided:
        raise TypeError(f"{where}: hostreg staging takes strided tensors, not {t.layout}")
    if t.is_quantized:
        raise TypeError(f"{where}: hostreg staging takes plain tensors, not quantized ({t.dtype}) ones")


def touched(t: torch.Tensor) -> tuple[int, int]:
    """[first, end) bytes of t's storage its elements lie in (t not empty)."""
    size = t.element_size()
    first = t.storage_offset() * size
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return first, first + (last + 1) * size


@dataclass(frozen=True)
class Grouping:
    """How a list of (local) tensors share storages.

    ``group[i]`` is tensor i's span (-1: empty, no bytes), ``offset[i]`` the byte offset of its
    first element from its span's start, ``spans[g]`` the (start in the source storage,
    nbytes) of span g; ``own[i]``: tensor i is copied with ``copy_`` into a contiguous span of
    its own (a conjugate or negative view)."""

    group: tuple[int, ...]
    offset: tuple[int, ...]
    spans: tuple[tuple[int, int], ...]
    own: tuple[bool, ...]

    def shape_key(self) -> tuple:
        """What two groupings must share for bytes to be copied span by span (a source's own
        spans are copied with copy_ into whatever contiguous tensor holds them)."""
        return (self.group, self.offset, tuple(n for _, n in self.spans))


def group(locals_: list[torch.Tensor]) -> Grouping:
    """Group tensors by the storage they view (see the module docstring)."""
    index: dict[Any, int] = {}
    lo: list[int] = []
    hi: list[int] = []
    grp: list[int] = []
    first: list[int] = []
    own: list[bool] = []
    for t in locals_:
        n = t.numel()
        if n == 0:
            grp.append(-1)
            first.append(0)
            own.append(False)
            continue
        size = t.element_size()
        alone = t.is_meta or t.is_conj() or t.is_neg()
        if alone:
            a = b = 0
        elif t.is_contiguous():  # the usual leaf: its bytes without walking the strides
            a = t.storage_offset() * size
            b = a + n * size
        else:
            a, b = touched(t)
            alone = b - a < n * size
        if alone:
            # A meta tensor (no storage: every one reports address 0, so they cannot be told
            # apart by storage; as PyTorch's _create_cpu_state_dict, each gets bytes of its
            # own), a conjugate or negative view, or elements that alias one another (an
            # expanded tensor): a contiguous tensor of its values, in a span of its own.
            index[("own", len(grp))] = g = len(lo)
            lo.append(0)
            hi.append(n * size)
            grp.append(g)
            first.append(0)
            own.append(True)
            continue
        # The storage's address is the tensor's less its offset (cheaper than asking for the
        # storage object); CPU storages by address, others by device and address.
        ptr = t.data_ptr() - a
        key: Any = ptr if t.is_cpu else (t.device, ptr)
        g = index.setdefault(key, len(lo))
        if g == len(lo):
            lo.append(a)
            hi.append(b)
        else:
            if a < lo[g]:
                lo[g] = a
            if b > hi[g]:
                hi[g] = b
        grp.append(g)
        first.append(a)
        own.append(False)
    starts = [x - x % _ELEMENT for x in lo]
    offset = tuple(f - starts[g] if g >= 0 and not o else 0 for f, g, o in zip(first, grp, own))
    return Grouping(tuple(grp), offset, tuple((s, h - s) for s, h in zip(starts, hi)), tuple(own))


class LeafMeta(NamedTuple):
    """What a staged leaf is, besides its bytes: dtype, shape and strides of its local tensor,
    and for a DTensor its mesh, placements, global shape and global strides. (A named tuple:
    one is made per tensor per stage, and it is part of the arena's key.)"""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtensor: tuple | None


def leaf_meta(t: torch.Tensor, own: bool) -> LeafMeta:
    if type(t) is torch.Tensor:  # the usual leaf, without asking for a local shard
        local, dmeta = t, None
    else:
        local = local_of(t)
        dmeta = placement_of(t, local) if local is not t else None
    shape = tuple(local.shape)
    stride = contiguous_strides(shape) if own or local.numel() == 0 else local.stride()
    return LeafMeta(local.dtype, shape, stride, dmeta)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of a contiguous tensor of ``shape`` (in elements; dimensions of size 0 count as 1)."""
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Layout:
    """Where a state dict goes in its arena: its structure, each leaf's place, each span's place
    (the arena, :class:`Arena`, is the memory; the layout is the plan for it)."""

    spec: _tree.Spec
    grouping: Grouping
    leaves: tuple[LeafMeta, ...]
    span_offsets: tuple[int, ...]  #: where each span starts in the arena
    nbytes: int  #: arena size

    @property
    def key(self) -> tuple:
        """Equal for two state dicts exactly when one arena serves both."""
        return (self.spec, self.grouping.shape_key(), self.leaves)


Flat = tuple  # (tensors, other values, spec), as _tree.flatten gives them
Prepared = tuple  # (layout, tensors, other values), as layout_of gives them


def flatten_checked(state_dict: Any) -> Flat:
    """``_tree.flatten(state_dict)``, with TypeError for tensors no arena can hold (naming the
    entry): what a stager can refuse before it stages anything."""
    tensors, values, spec = _tree.flatten(state_dict)
    # A first pass that only says whether any tensor needs a closer look (DTensors are judged
    # by their local shards, as check_leaf does). torch's layouts are singletons: `is` is exact.
    plain, param, strided, dt = torch.Tensor, torch.nn.Parameter, torch.strided, dtensor_type()
    shards = [t._local_tensor if type(t) is dt else t for t in tensors] if dt is not None else tensors  # type: ignore[attr-defined]
    if any(
        (type(t) is not plain and type(t) is not param) or t.layout is not strided or t.is_quantized or t.is_nested
        for t in shards
    ):
        for path, t in zip(_tree.tensor_paths(spec), tensors):  # only then: name the entry
            check_leaf(path, t)
    return tensors, values, spec


def layout_of(state_dict: Any, flat: Flat | None = None) -> tuple[Layout, list[torch.Tensor], list[Any]]:
    """(layout, tensors, other values) of ``state_dict`` (already flattened by
    :func:`flatten_checked` when ``flat`` is given); TypeError for tensors it cannot place."""
    tensors, values, spec = flat if flat is not None else flatten_checked(state_dict)
    locals_ = [local_of(t) for t in tensors]
    g = group(locals_)
    offsets, at = [], 0
    for _, n in g.spans:
        at = -(-at // ALIGNMENT) * ALIGNMENT
        offsets.append(at)
        at += n
    leaves = tuple(leaf_meta(t, o) for t, o in zip(tensors, g.own))
    return Layout(spec, g, leaves, tuple(offsets), at), tensors, values
