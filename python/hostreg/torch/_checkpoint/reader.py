"""DCP ``StorageReader`` for DCP's own file format at the disk's speed (docs/checkpoint.md)."""

from __future__ import annotations

import array
import dataclasses
import io
import os
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader as _StockReader
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.futures import Future

from ... import _hostreg
from . import container_read as _container
from .files import BLOCK, IoStats, _address, _open, _raise_io

HEAD = 4096  # bytes read from a container's start: its pickle and headers
TAIL = 4096  # and from its end: the central directory
WHOLE = 1 << 20  # containers up to this size are read whole in the first pass (data included)


class FileSystemReader(_StockReader):
    """DCP ``StorageReader`` for checkpoints of DCP's ``FileSystemWriter`` and hostreg's.

    ``dcp.load(sd, storage_reader=FileSystemReader(path))``. Each file is read with
    ``O_DIRECT`` (where the filesystem allows) by ``thread_count`` threads of the C core
    (``hostregFileRead``): first the containers' headers, then every tensor's bytes, straight
    into a contiguous CPU destination of the same dtype (the only copy is from a bounce
    buffer where file and memory alignment differ), or into one staging buffer and from there
    into the destination (non-blocking for accelerator destinations, from page-locked memory
    where hostreg can register it). Resharding works as with DCP's reader: read items narrow
    the stored tensors. Items with stream transforms, or containers that are not a plain
    tensor's, go to DCP's own reader. A truncated or unreadable file raises ``OSError``.
    """

    def __init__(self, path: str | os.PathLike, thread_count: int = 4, *, direct_io: bool = True) -> None:
        super().__init__(path)
        if isinstance(thread_count, bool) or not isinstance(thread_count, int) or thread_count < 1:
            raise ValueError(f"thread_count must be an int >= 1, got {thread_count!r}")
        self.thread_count = thread_count
        self.direct_io = direct_io
        self.stats = IoStats()

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        self.stats = IoStats()
        per_file: dict[str, list[Any]] = {}
        slow: list[Any] = []
        for req in plan.items:
            info = self.storage_data[req.storage_index]
            if getattr(info, "transform_descriptors", None):
                slow.append(req)
            else:
                per_file.setdefault(info.relative_path, []).append(req)
        for rel, reqs in per_file.items():
            slow += self._read_file(os.path.join(os.fspath(self.path), rel), reqs, planner)
        if slow:
            super().read_data(dataclasses.replace(plan, items=slow), planner).wait()
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _transfer(self, fd: int, segments: list[tuple[int, int, int]]) -> None:
        segments.sort()
        seg = array.array("Q")
        for s in segments:
            seg.extend(s)
        got = _hostreg.file_read(fd, seg.buffer_info()[0], len(segments), self.thread_count)
        if got[0] != 0:
            _raise_io("cannot read the checkpoint file")
        self.stats.add(got)

    def _read_file(self, path: str, reqs: list[Any], planner: LoadPlanner) -> list[Any]:
        """Serves ``reqs`` from one file; returns those left to DCP's reader."""
        fd = _open(path, os.O_RDONLY, self.direct_io)
        try:
            return self._serve(fd, reqs, planner)
        finally:
            os.close(fd)

    def _serve(self, fd: int, reqs: list[Any], planner: LoadPlanner) -> list[Any]:
        # Pass 1: every byte item whole, and each tensor container's first and last bytes.
        items: dict[Any, Any] = {}
        byte_items: set[Any] = set()
        for req in reqs:
            items.setdefault(req.storage_index, self.storage_data[req.storage_index])
            if req.type == LoadItemType.BYTE_IO:
                byte_items.add(req.storage_index)
        windows: dict[Any, tuple[bytearray, bytearray]] = {}  # (first bytes, last bytes): one buffer when whole
        segs = []
        for idx, info in items.items():
            whole = idx in byte_items or info.length <= WHOLE
            if whole:
                buf = bytearray(info.length)
                windows[idx] = (buf, buf)
                if info.length:
                    segs.append((info.offset, info.length, _address(buf)))
            else:
                head, tail = bytearray(HEAD), bytearray(TAIL)
                windows[idx] = (head, tail)
                segs.append((info.offset, HEAD, _address(head)))
                segs.append((info.offset + info.length - TAIL, TAIL, _address(tail)))
        self._transfer(fd, segs)

        # Pass 2: the tensors' bytes, into their destinations or a staging buffer.
        slow: list[Any] = []
        segs = []  # (file offset, bytes, address): what the second read fills
        done: list[
            tuple[Any, torch.Tensor, torch.Tensor | None]
        ] = []  # (req, destination, staged view to copy or None)
        for req in reqs:
            info = items[req.storage_index]
            head, tail = windows[req.storage_index]
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(bytes(head)))
                continue
            st = _container.parse(head, tail, info.length)
            if st is None:
                slow.append(req)
                continue
            done.append(self._place(info, st, req, planner, segs, head if head is tail else None))
        if segs:
            self._transfer(fd, segs)
        accel = False
        for req, target, view in done:
            if view is not None:
                accel |= target.device.type != "cpu"
                target.copy_(view, non_blocking=target.device.type != "cpu")
            planner.commit_tensor(req, target)
        if accel and hasattr(torch, "accelerator"):
            torch.accelerator.synchronize()
        return slow

    def _place(
        self, info: Any, st: Any, req: Any, planner: LoadPlanner, segs: list, whole: bytearray | None
    ) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
        """Plans where the bytes of read item ``req`` go (appended to ``segs``): straight into its
        destination when that is one byte range of the stored tensor and a contiguous CPU tensor
        of its dtype; else the covering rows into a staging buffer. A container already read
        ``whole`` (its bytes from its first one) is copied from there instead. Returns (req,
        destination, the view to copy into it after the read, or None)."""
        itemsize = st.dtype.itemsize
        shape = st.shape
        offs = tuple(req.storage_offsets)
        lens = tuple(req.lengths)
        row = itemsize
        for n in shape[1:]:
            row *= n
        base = info.offset + st.data_offset + st.storage_offset * itemsize
        target = planner.resolve_tensor(req).detach()
        if not shape:  # 0-d
            first, rows, inner_full = 0, 1, True
        else:
            first, rows = offs[0], lens[0]
            inner_full = all(o == 0 and n == s for o, n, s in zip(offs[1:], lens[1:], shape[1:]))
        nbytes = rows * row
        if tuple(target.shape) != (lens if shape else ()):
            raise AssertionError(f"req {req.storage_index} mismatch sizes {tuple(target.shape)} vs {lens}")
        off = base + first * row
        if whole is not None:
            at = off - info.offset
            if nbytes == 0:
                return req, target, None
            buf = torch.frombuffer(whole, dtype=torch.uint8, count=nbytes, offset=at)
            return req, target, self._rows(buf, st, rows, offs, lens)
        if (
            inner_full
            and target.device.type == "cpu"
            and target.dtype == st.dtype
            and target.is_contiguous()
            and not (target.is_conj() or target.is_neg())
        ):
            if nbytes:
                segs.append((base + first * row, nbytes, target.data_ptr()))
            return req, target, None
        buf = _staging(nbytes, off, pinned=target.device.type != "cpu")
        if nbytes:
            segs.append((off, nbytes, buf.data_ptr()))
        return req, target, self._rows(buf, st, rows, offs, lens)

    @staticmethod
    def _rows(buf: torch.Tensor, st: Any, rows: int, offs: tuple, lens: tuple) -> torch.Tensor:
        """The read item's part of ``rows`` whole rows of the stored tensor held in ``buf``."""
        shape = st.shape
        view = buf.view(st.dtype).view((rows, *shape[1:]) if shape else ())
        for d in range(1, len(shape)):
            view = view.narrow(d, offs[d], lens[d])
        return view


def _staging(nbytes: int, file_offset: int, pinned: bool) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` whose address is congruent to ``file_offset``
    modulo the block, so that the read goes straight into it; page-locked when ``pinned`` and
    hostreg can register it (the arena is freed with the tensor)."""
    extra = BLOCK
    raw: torch.Tensor | None = None
    if pinned and nbytes:
        from ..._errors import StagingError
        from .._arena import Arena

        try:
            arena = Arena(nbytes + extra, pin=True, share=False)
            raw = arena.view(0, (nbytes + extra,), torch.uint8)
        except StagingError:
            raw = None
    if raw is None:
        raw = torch.empty(nbytes + extra, dtype=torch.uint8)
    shift = (file_offset - raw.data_ptr()) % BLOCK
    return raw[shift : shift + nbytes]
