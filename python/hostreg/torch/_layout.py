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

import operator
from array import array
from dataclasses import dataclass
from itertools import compress, repeat
from operator import add, mul, not_, sub
from typing import Any, NamedTuple

import torch

from .. import _hostreg
from .._errors import StagingError
from . import _tree
from ._dtensor import dtensor_type, local_of, placement_of

# Tensor properties as functions of the tensor, for map() over many tensors at once (no
# Python frame per tensor); the other modules of staging take them from here.
is_meta = operator.attrgetter("is_meta")
is_cpu = operator.attrgetter("is_cpu")
dtype_of = operator.attrgetter("dtype")
device_of = operator.attrgetter("device")
layout_of_tensor = operator.attrgetter("layout")
is_nested = operator.attrgetter("is_nested")
is_quantized = operator.attrgetter("is_quantized")
nbytes_of = operator.attrgetter("nbytes")


def int64_tensor(values: list[int]) -> torch.Tensor:
    """An int64 tensor of ``values`` (by way of an ``array``: about ten times faster than
    ``torch.tensor`` of a list)."""
    return torch.frombuffer(array("q", values), dtype=torch.int64) if values else torch.zeros(0, dtype=torch.int64)


def bool_tensor(values: Any) -> torch.Tensor:
    """A bool tensor of the truth values ``values`` (an iterable of bools, e.g. a ``map``)."""
    raw = bytearray(values)
    return torch.frombuffer(raw, dtype=torch.bool) if raw else torch.zeros(0, dtype=torch.bool)


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
    #: the first tensor of each span
    first: tuple[int, ...]

    def as_destination(self) -> Grouping:
        """The grouping of the staged tensors laid out by this one (what :func:`group` of them
        gives): each span is a storage of its own from byte 0, offsets kept, and no tensor has
        a span of its own any more (its values are contiguous there)."""
        return Grouping(
            self.group, self.offset, tuple((0, n) for _, n in self.spans), (False,) * len(self.group), self.first
        )

    def shape_key(self) -> tuple:
        """What two groupings must share for bytes to be copied span by span (a source's own
        spans are copied with copy_ into whatever contiguous tensor holds them)."""
        return (self.group, self.offset, tuple(n for _, n in self.spans))


def group(locals_: list[torch.Tensor]) -> Grouping:
    """Group tensors by the storage they view (see the module docstring).

    Each tensor's properties are read from torch a property at a time over all of them
    (``map`` over torch's accessors); the grouping itself is the C core's
    (``hostregGroupRanges``), one call for all of them."""
    plain = torch.Tensor
    n = len(locals_)
    numel = list(map(plain.numel, locals_))
    size = list(map(plain.element_size, locals_))
    offset = list(map(plain.storage_offset, locals_))
    contiguous = list(map(plain.is_contiguous, locals_))
    # A meta tensor (no storage: every one reports address 0, so they cannot be told apart by
    # storage; as PyTorch's _create_cpu_state_dict, each gets bytes of its own), a conjugate or
    # negative view, or elements that alias one another (an expanded tensor): a contiguous
    # tensor of its values, in a span of its own.
    every = range(n)
    alone = set(compress(every, map(is_meta, locals_)))
    alone.update(compress(every, map(plain.is_conj, locals_)), compress(every, map(plain.is_neg, locals_)))
    first = list(map(mul, offset, size))
    end = list(map(add, first, map(mul, numel, size)))  # contiguous: the elements' bytes
    for i in compress(every, map(not_, contiguous)):  # strided views: walk their strides
        if numel[i]:
            a, b = touched(locals_[i])
            end[i] = b
            if b - a < numel[i] * size[i]:
                alone.add(i)
    # The storage's address is the tensor's less its offset (cheaper than asking for the
    # storage); empty and alone tensors are not grouped by it.
    key = list(map(sub, map(plain.data_ptr, locals_), first))
    for i in alone:
        first[i], end[i], key[i] = 0, numel[i] * size[i], 0
    if min(key, default=0) < 0:  # an empty tensor whose offset is past its storage's (null) address
        key = [max(k, 0) for k in key]
    if max(end, default=0) >= 1 << 64:  # an expanded tensor of 2**64 bytes or more: no size_t holds it
        raise beyond_address_space(sum(b - a for a, b in zip(first, end)))
    cpu = list(map(is_cpu, locals_))
    domain = None
    if not all(cpu):  # storages by device and address
        devices: dict[Any, int] = {}
        domain = [0 if c else devices.setdefault(t.device, len(devices) + 1) for t, c in zip(locals_, cpu)]
    grp, off, span_start, span_bytes = _hostreg.group_ranges(key, domain, first, end, sorted(alone), _ELEMENT)
    own = [False] * n
    for i in alone:
        if numel[i]:
            own[i] = True
    by_span = dict(zip(reversed(grp), range(n - 1, -1, -1)))  # span -> its first tensor (earlier ones win)
    first_leaf = tuple(map(by_span.__getitem__, range(len(span_start))))
    return Grouping(tuple(grp), tuple(off), tuple(zip(span_start, span_bytes)), tuple(own), first_leaf)


def beyond_address_space(nbytes: int) -> StagingError:
    """The failure for staging memory of ``nbytes`` >= 2**64 bytes: what the C core gives a size
    it cannot map, before it is asked."""
    return StagingError(
        f"cannot stage {nbytes:,} bytes of staging memory: cudaErrorMemoryAllocation (2): more than a "
        "64-bit address space holds (2**64 bytes)"
    )


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


def _leaf_metas(tensors: list[torch.Tensor], locals_: list[torch.Tensor], g: Grouping) -> tuple[LeafMeta, ...]:
    """``leaf_meta`` of every tensor, a property at a time over all of them for plain tensors
    with spans of the source's strides (the usual leaves), one by one for the others."""
    plain = torch.Tensor
    if not set(map(type, tensors)) <= {plain} or any(g.own) or -1 in g.group:
        return tuple(leaf_meta(t, o) for t, o in zip(tensors, g.own))
    shapes = map(tuple, map(plain.size, locals_))
    return tuple(map(LeafMeta, map(dtype_of, locals_), shapes, map(plain.stride, locals_), repeat(None)))


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
    return check_flat(_tree.flatten(state_dict))


def check_flat(flat: Flat) -> Flat:
    """``flat`` (from ``_tree.flatten``), or TypeError for its first tensor no arena can hold."""
    tensors, values, spec = flat
    # A first pass, property by property over every tensor (``map`` over torch's accessors,
    # no Python frame per tensor), that only says whether any tensor needs a closer look:
    # DTensors are judged by their local shards, as check_leaf does; torch's layouts are
    # singletons.
    plain, param, dt = torch.Tensor, torch.nn.Parameter, dtensor_type()
    kinds = set(map(type, tensors))
    shards = tensors
    if dt is not None and dt in kinds:
        shards = [t._local_tensor if type(t) is dt else t for t in tensors]  # type: ignore[attr-defined]
        kinds = set(map(type, shards))
    if (
        not kinds <= {plain, param}
        or not set(map(layout_of_tensor, shards)) <= {torch.strided}
        or any(map(is_nested, shards))
        or any(map(is_quantized, shards))
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
    leaves = _leaf_metas(tensors, locals_, g)
    return Layout(spec, g, leaves, tuple(offsets), at), tensors, values
