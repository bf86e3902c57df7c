"""What a copy reads: each source tensor's key (where its elements lie and how they are
viewed, so that a staged layout can be reused for sources with an equal key), the checks that
its storage still holds what it views, and the refusal of copies whose sources overlap their
destinations (``_copy.py`` uses them)."""

from __future__ import annotations

from itertools import repeat
from operator import add, and_, ge, gt, lt, mul, sub
from typing import Any

import torch

from .._errors import StagingError
from ._dtensor import local_of, placement_of
from ._layout import Grouping, device_of, dtype_of, is_cpu, touched


def _check_sources(slocals: list[torch.Tensor], storages: list[Any]) -> None:
    """Every non-empty source's storage still holds the bytes its view reads: a storage freed or
    shrunk under it (``untyped_storage().resize_(0)``, e.g. while async staging waits) raises
    StagingError instead of a copy from freed memory. Run whenever the sources' storages or
    views changed (a resize changes the storage's address). A resize during the copy itself is
    the caller's race, as it is for ``Tensor.copy_``."""
    plain = torch.Tensor
    # The usual sources at once (each property over all of them): contiguous, with storages
    # that hold their bytes; anything else (empty, meta, strided views) tensor by tensor below.
    size = list(map(plain.element_size, slocals))
    needed = list(map(mul, map(add, map(plain.storage_offset, slocals), map(plain.numel, slocals)), size))
    if (
        all(map(ge, map(torch.UntypedStorage.nbytes, storages), needed))
        and all(map(torch.UntypedStorage.data_ptr, storages))
        and all(map(plain.is_contiguous, slocals))
    ):
        return
    for i, (t, st) in enumerate(zip(slocals, storages)):
        n = t.numel()
        if n == 0 or t.is_meta:
            continue
        size = t.element_size()
        have = st.nbytes()
        if have >= (t.storage_offset() + n) * size and st.data_ptr() and t.is_contiguous():
            continue  # the common case, without walking the strides
        need = touched(t)[1]
        if st.data_ptr() == 0 or have < need:
            raise StagingError(
                f"source tensor {i}: its storage holds {st.nbytes():,} bytes, fewer than the {need:,} its view "
                "reads (freed or resized, e.g. with untyped_storage().resize_(), before it was staged)"
            )


def _span_ptrs(locals_: list[torch.Tensor], g: Grouping) -> list[int]:
    """Address of each span's first byte (CPU), from the first tensor of the span: its own
    address less its offset in the span (0 for a span of its own)."""
    firsts = list(map(locals_.__getitem__, g.first))
    return list(map(sub, map(torch.Tensor.data_ptr, firsts), map(g.offset.__getitem__, g.first)))


def _leaf_key(t: torch.Tensor) -> tuple:
    return (t.dtype, t.shape, t.stride(), t.device)


def _views(ts: list[torch.Tensor]) -> tuple[list, list, list, list]:
    """The columns of ``_leaf_key`` over ``ts``: dtypes, shapes, strides, devices."""
    plain = torch.Tensor
    return (
        list(map(dtype_of, ts)),
        list(map(plain.size, ts)),
        list(map(plain.stride, ts)),
        list(map(device_of, ts)),
    )


def source_key(tensors: list[torch.Tensor]) -> tuple:
    """What a copy plan and a layout depend on, per source tensor: where its elements are
    (address, offset in its storage, dtype, shape, strides, device) and how their values are
    read (conjugate and negative bits); for a DTensor, also its mesh, placements and global
    shape. Two keys compare equal only when the sources lie where, and are viewed as, they
    were: the staging done for one is valid for the other (values apart). Not the tensor
    objects themselves: ``state_dict()`` makes new ones every call.

    Built column by column (one list per property, each read with ``map`` over torch's own
    accessors, no Python frame per tensor): about 0.5 us a tensor, nearly all of it torch's
    accessors themselves."""
    plain = torch.Tensor
    if set(map(type, tensors)) <= {plain}:
        locals_: list[torch.Tensor] = tensors
        extra: list[Any] | None = None
    else:
        locals_ = [local_of(t) for t in tensors]
        extra = [placement_of(t, local) if local is not t else type(t) for t, local in zip(tensors, locals_)]
    cpu = list(map(is_cpu, locals_))
    return (
        list(map(plain.data_ptr, locals_)),
        list(map(plain.storage_offset, locals_)),
        list(map(dtype_of, locals_)),
        list(map(plain.size, locals_)),
        list(map(plain.stride, locals_)),
        cpu if all(cpu) else list(map(device_of, locals_)),
        list(map(plain.is_conj, locals_)),
        list(map(plain.is_neg, locals_)),
        extra,
    )


Range = tuple[int, int]  # [start, end) addresses


def refuse_overlap(src: list[Range], dst: list[Range], same: list[bool] | None = None) -> list[int]:
    """The indices of the pairs to copy, pair i being the bytes ``src[i]`` into ``dst[i]``:
    ValueError when any source range overlaps any destination range (``Tensor.copy_`` refuses
    partial overlap; copies in any order would read bytes already overwritten). A pair that is
    its own destination exactly (``same[i]``; by default equal ranges) is skipped: nothing to
    copy. O(n) when no source falls inside the destinations' extent (the usual case: they are
    one arena), else a sweep."""
    live = [
        i for i, (s, d) in enumerate(zip(src, dst)) if s[1] > s[0] and not (same[i] if same is not None else s == d)
    ]
    if not live:
        return live
    lo = min(dst[i][0] for i in live)
    hi = max(dst[i][1] for i in live)
    if not any(src[i][0] < hi and src[i][1] > lo for i in live):
        return live
    events = sorted([(*src[i], "s", i) for i in live] + [(*dst[i], "d", i) for i in live])
    furthest = {"s": (0, -1), "d": (0, -1)}  # furthest end seen so far of each kind, and whose
    for start, end, kind, i in events:
        other = "d" if kind == "s" else "s"
        if furthest[other][0] > start:
            s_i, d_i = (i, furthest[other][1]) if kind == "s" else (furthest[other][1], i)
            raise ValueError(
                f"source {s_i} overlaps destination {d_i}: copying would read bytes already "
                "overwritten (unsupported, as with Tensor.copy_)"
            )
        if end > furthest[kind][0]:
            furthest[kind] = (end, i)
    return live


def _apart(src: list[int], dst: list[int], nbytes: list[int]) -> bool:
    """No source range ``[src[i], src[i] + nbytes[i])`` meets the destinations' extent (the
    usual case: they are one arena); else :func:`refuse_overlap` looks closer."""
    lo = min(dst, default=0)
    hi = max(map(add, dst, nbytes), default=0)
    return not any(map(and_, map(lt, src, repeat(hi)), map(gt, map(add, src, nbytes), repeat(lo))))


def _extent(t: torch.Tensor) -> Range:
    """The bytes t's elements lie in (empty for an empty tensor)."""
    if t.numel() == 0:
        return (0, 0)
    base = t.untyped_storage().data_ptr()
    first, end = touched(t)
    return (base + first, base + end)
