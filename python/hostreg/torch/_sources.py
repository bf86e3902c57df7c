"""What a copy reads: each source tensor's key (where its elements lie and how they are
viewed, so that a staged layout can be reused for sources with an equal key), the checks that
its storage still holds what it views, and the refusal of copies whose sources overlap their
destinations (``_copy.py`` uses them)."""

from __future__ import annotations

from typing import Any

import torch

from ._dtensor import local_of, placement_of
from ._layout import Grouping, touched


def _check_sources(slocals: list[torch.Tensor], storages: list[Any]) -> None:
    """Every non-empty source's storage still holds the bytes its view reads: a storage freed or
    shrunk under it (``untyped_storage().resize_(0)``, e.g. while async staging waits) raises
    RuntimeError instead of a copy from freed memory. Run whenever the sources' storages or
    views changed (a resize changes the storage's address). A resize during the copy itself is
    the caller's race, as it is for ``Tensor.copy_``."""
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
            raise RuntimeError(
                f"source tensor {i}: its storage holds {st.nbytes():,} bytes, fewer than the {need:,} its view "
                "reads (freed or resized, e.g. with untyped_storage().resize_(), before it was staged)"
            )


def _span_ptrs(locals_: list[torch.Tensor], g: Grouping) -> list[int]:
    """Address of each span's first byte (CPU), from the first tensor of the span."""
    ptrs = [0] * len(g.spans)
    seen = [False] * len(g.spans)
    for t, s, own in zip(locals_, g.group, g.own):
        if s >= 0 and not seen[s]:
            seen[s] = True
            ptrs[s] = t.data_ptr() if own else t.untyped_storage().data_ptr() + g.spans[s][0]
    return ptrs


def _leaf_key(t: torch.Tensor) -> tuple:
    return (t.dtype, t.shape, t.stride(), t.device)


def source_key(tensors: list[torch.Tensor]) -> list[tuple]:
    """What a copy plan and a layout depend on, per source tensor: where its elements are
    (address, offset in its storage, dtype, shape, strides, device) and how their values are
    read (conjugate and negative bits); for a DTensor, also its mesh, placements and global
    shape. Two lists compare equal only when the sources lie where, and are viewed as, they
    were: the staging done for one is valid for the other (values apart). Not the tensor
    objects themselves: ``state_dict()`` makes new ones every call. About 1 us a tensor."""
    out = []
    plain = torch.Tensor
    for t in tensors:
        if type(t) is plain:
            local, extra = t, None
        else:
            local = local_of(t)
            extra = placement_of(t, local) if local is not t else type(t)
        out.append(
            (
                local.data_ptr(),
                local.storage_offset(),
                local.dtype,
                local.shape,
                local.stride(),
                local.is_cpu or local.device,
                local.is_conj(),
                local.is_neg(),
                extra,
            )
        )
    return out


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


def _extent(t: torch.Tensor) -> Range:
    """The bytes t's elements lie in (empty for an empty tensor)."""
    if t.numel() == 0:
        return (0, 0)
    base = t.untyped_storage().data_ptr()
    first, end = touched(t)
    return (base + first, base + end)
