"""The part of a checkpoint file that is the same at every save of one structure: the tensors'
containers, laid out once and written again from the same bytes (docs/planning.md).

A file's layout (where each container starts, its headers, the padding that puts each
tensor's bytes at a file offset congruent to its address, so that ``O_DIRECT`` takes them
straight from memory) depends only on the items, each tensor's dtype and shape, and each
tensor's address modulo the block. A save whose planner (hostreg's :class:`SavePlanner`)
vouches that the structure is one it planned before, with the same plan items, reuses the
:class:`FixedPart` made then: the same header bytes (the CRC-32 fields are filled in again by
the C core at each write), the same segments with the tensors' addresses of this save, the
same write results. Only if a tensor's address moved to another offset in its block is the
part laid out again. Items that are not such tensors (bytes items, tensors written by
``torch.save`` or copied first) follow in a part laid out at each save.

The containers of a fixed part keep the ``.data/serialization_id`` of the save that laid it
out: torch reads that record only to log it (``torch/serialization.py``, ``_load``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from ... import _hostreg
from . import container as _container
from . import keyed
from .files import BLOCK, IoStats, _address, _raise_io
from .parts import _FileLayout


def fixable(item: Any, data: Any) -> bool:
    """Is ``data`` (item's) written from its own memory as it is: a plain, contiguous CPU tensor
    that ``torch.save`` would describe as hostreg's containers do?"""
    return (
        item.type != WriteItemType.BYTE_IO
        and type(data) is torch.Tensor
        and _container.encodable(data)
        and data.device.type == "cpu"
        and data.is_contiguous()
        and not (data.is_conj() or data.is_neg())
    )


class FixedPart:
    """One file's tensor containers laid out (``rows``: the segment of each tensor with bytes;
    ``mods``: their addresses modulo the block when laid out); ``results`` in the order of
    ``index`` (positions in the plan's items)."""

    def __init__(
        self, items: list, index: list[int], lays: list[_FileLayout], rows: list[int], ptrs: list[int], results: list
    ) -> None:
        self.items = items  # the plan's items it was laid out for (kept: compared by identity)
        self.meta = [lay.meta for lay in lays]  # the bytes the segments point into (kept alive here)
        pieces = [(off, n, _address(lay.meta) + mo if t is None else 0) for lay in lays for off, n, mo, t in lay.pieces]
        self.seg = torch.tensor(pieces, dtype=torch.int64).reshape(-1, 3)
        self.rows = torch.tensor([r for r in rows if r >= 0], dtype=torch.int64)
        self.byte_items = [i for i, r in zip(index, rows) if r >= 0]  # plan positions of the tensors with bytes
        taken = set(index)
        self.rest = [i for i in range(len(items)) if i not in taken]  # laid out at each save
        self.mods = torch.tensor(ptrs, dtype=torch.int64) % BLOCK
        patches, first = [], 0  # each layout's piece numbers, made the part's
        for lay in lays:
            patches += [(data + first, into + first, at) for data, into, at in lay.patches]
            first += len(lay.pieces)
        self.patches = torch.tensor(patches, dtype=torch.int64).reshape(-1, 3)
        self.results = results
        self.token = keyed.new_token(results)  # names the results between ranks (metadata_file.Results)
        self.end = lays[-1].pos
        self.lock = threading.Lock()  # one write at a time from these bytes (the CRCs are written into them)

    def addresses(self, data: list) -> torch.Tensor:
        """The addresses of this save's tensors with bytes (``data``: every item's), in order."""
        ts = list(map(data.__getitem__, self.byte_items))
        return torch.tensor(list(map(torch.Tensor.data_ptr, ts)), dtype=torch.int64)

    def fits(self, ptrs: torch.Tensor) -> bool:
        """Do tensors at ``ptrs`` (from :meth:`addresses`) lie as the ones it was laid out for?"""
        return bool(torch.equal(ptrs % BLOCK, self.mods))

    def write(self, fd: int, threads: int, flags: int, stats: IoStats) -> None:
        """Writes the part (its segments' addresses set by :func:`point`), as _FileLayout.write."""
        got = _hostreg.file_write(
            fd, self.seg.data_ptr(), self.seg.shape[0], self.patches.data_ptr(), self.patches.shape[0], threads, flags
        )
        if got[0] != 0:
            _raise_io("cannot write the checkpoint file")
        stats.add(got)

    def point(self, ptrs: torch.Tensor) -> None:
        """Sets the tensors' segments to this save's addresses."""
        self.seg[self.rows, 2] = ptrs


def lay_out(
    name: str, items: list, data: list, index: list[int], sid: bytes, add_tensor: Any, submit: Any = None
) -> tuple[FixedPart, _FileLayout]:
    """The fixed part of file ``name`` for ``items[i]`` with ``data[i]``, i in ``index`` (all
    :func:`fixable`), laid out from offset 0 by ``add_tensor`` (the writer's), padded to the
    block, and the last layout of it. With ``submit``, it is laid out in parts (``parts.py``:
    each full one padded to the block), each but the last handed to ``submit`` as the next
    begins, so that the caller writes them while the rest is laid out; the last is returned for
    the caller to write (the part's own :meth:`FixedPart.write` writes it all, at later saves).
    The layouts hold this save's tensors: the part keeps only their bytes and segments."""
    lay = _FileLayout()
    lays = [lay]
    align = _container.STORAGE_ALIGNMENT
    rows, ptrs, results = [], [], []
    first = 0  # pieces of the layouts before lay
    for i in index:
        if submit is not None and lay.full():
            lay.close_part()
            submit(lay)
            first += len(lay.pieces)
            lay = _FileLayout(lay.pos)
            lays.append(lay)
        t = data[i]
        before = len(lay.pieces)
        start = add_tensor(lay, t, align, sid)
        got = [j for j in range(before, len(lay.pieces)) if lay.pieces[j][3] is not None]
        rows.append(first + got[0] if got else -1)
        if got:
            ptrs.append(t.data_ptr())
        lay.items += 1
        results.append(
            WriteResult(
                index=items[i].index,
                size_in_bytes=lay.pos - start,
                storage_data=_StorageInfo(name, start, lay.pos - start),
            )
        )
    lay.close_part()
    return FixedPart(items, index, lays, rows, ptrs, results), lay


_KEEP = 2  # fixed parts remembered per process (their header bytes: about 1 KB a tensor)
_lock = threading.Lock()
_parts: OrderedDict[tuple, FixedPart] = OrderedDict()


def find(key: tuple, items: list) -> FixedPart | None:
    with _lock:
        got = _parts.get(key)
    return got if got is not None and got.items is items else None


def keep(key: tuple, part: FixedPart) -> None:
    with _lock:
        _parts[key] = part
        _parts.move_to_end(key)
        while len(_parts) > _KEEP:
            _parts.popitem(last=False)


def clear() -> None:
    with _lock:
        _parts.clear()
