"""DCP storage writer and reader at the disk's own speed (docs/checkpoint.md).

:class:`FileSystemWriter` writes what DCP's own ``FileSystemWriter`` writes, one file per rank
of ``torch.save`` containers (``_container.py``) plus ``.metadata``, so the stock
``FileSystemReader``, ``dcp.load`` and ``format_utils.dcp_to_torch_save`` read it; but each
tensor's bytes go from its memory (a hostreg arena, or any CPU tensor) straight to the disk
with ``O_DIRECT``, several large requests in flight, checksummed meanwhile, by the C core
(``hostregFileWrite``, include/hostreg/io.h). :class:`FileSystemReader` reads its own and stock
checkpoints the same way into the destination tensors.
"""

from __future__ import annotations

import array
import ctypes
import dataclasses
import io
import logging
import os
import pickle
import secrets
import stat
import threading
from typing import Any

import torch
from torch.futures import Future
from torch.distributed.checkpoint import FileSystemReader as _StockReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult

from . import _container
from .. import _hostreg
from .._core import last_error
from .._errors import HostregError

__all__ = ["FileSystemReader", "FileSystemWriter"]

_log = logging.getLogger("hostreg")

BLOCK = 4096  # HOSTREG_IO_BLOCK (include/hostreg/io.h)
MIN_DIRECT = 256 * 1024  # HOSTREG_IO_MIN_DIRECT
SUFFIX = ".distcp"  # DCP's DEFAULT_SUFFIX
METADATA = ".metadata"
_DCP_VERSION = "1.0.0"  # torch 2.13's CURRENT_DCP_VERSION; what its readers accept

from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix  # DCP's own records of where items lie


# ---- Files -----------------------------------------------------------------------------------

_told_buffered: set[str] = set()
_told_lock = threading.Lock()


def _say_buffered(directory: str, err: OSError) -> None:
    with _told_lock:
        if directory in _told_buffered:
            return
        _told_buffered.add(directory)
    _log.warning(
        "hostreg: %s refuses O_DIRECT (%s; ramfs, tmpfs before Linux 6.6 and some network filesystems do): checkpoints there are "
        "written and read through the page cache",
        directory,
        os.strerror(err.errno or 0),
    )


def _open(path: str, flags: int, direct: bool) -> int:
    """Opens ``path`` with O_DIRECT where its filesystem allows, else without (said once per
    directory)."""
    flags |= os.O_CLOEXEC
    if direct:
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644)
        except OSError as e:
            if e.errno != 22:  # EINVAL: this filesystem has no O_DIRECT
                raise
            _say_buffered(os.path.dirname(path) or ".", e)
    return os.open(path, flags, 0o644)


def _open_to_replace(path: str, direct: bool) -> int:
    """Opens ``path`` for writing a new file's bytes over whatever it held. An existing file of
    one link is written in place and cut to its new size by the write (``hostregFileWrite``
    truncates at its end): ``O_TRUNC`` would first free every block of it, about 0.25 s a GiB
    on ext4 (measured on this project's test machine), before the first byte is written. A
    file with other links (a hard-linked copy of an earlier checkpoint) is unlinked first, so
    that the copy keeps its bytes. Either way the file's old bytes are no checkpoint's once
    this rank writes: the coordinator removed ``.metadata`` before any rank wrote data."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and (st.st_nlink > 1 or not stat.S_ISREG(st.st_mode)):
        os.unlink(path)
    return _open(path, os.O_WRONLY | os.O_CREAT, direct)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raise_io(what: str) -> None:
    err = last_error()
    if err.native > 0:
        raise OSError(err.native, f"{what}: {err.message}")
    raise HostregError(f"{what}: {err.code}: {err.message}")


def _address(buf: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf)) if len(buf) else 0


@dataclasses.dataclass
class IoStats:
    """What the last transfer of a writer or reader did (bytes, requests, O_DIRECT or not)."""

    direct_bytes: int = 0
    bounced_bytes: int = 0
    requests: int = 0
    direct: bool = False
    copied_bytes: int = 0  # made contiguous or moved to the CPU in Python before writing

    def add(self, got: tuple[int, int, int, int, bool]) -> None:
        self.direct_bytes += got[1]
        self.bounced_bytes += got[2]
        self.requests += got[3]
        self.direct = got[4]


# ---- Writer ----------------------------------------------------------------------------------


class _FileLayout:
    """One part of a file being laid out, from file offset ``start`` on: bytes of our own
    (headers, pickles, small items) in one bytearray, and the tensors whose memory is written
    as it is, as segments in file order."""

    def __init__(self, start: int = 0) -> None:
        self.meta = bytearray()
        self.pieces: list[tuple[int, int, int, Any]] = []  # (file offset, length, meta offset or -1, tensor)
        self.patches: list[tuple[int, int, int]] = []  # (data piece, meta piece, offset in it)
        self.start = start
        self.pos = start
        self.items = 0
        self._open = -1  # index of the meta piece being extended, or -1

    def add_bytes(self, b: bytes | bytearray | memoryview) -> int:
        """Appends bytes of our own at the current position; returns the piece index."""
        n = len(b)
        if n == 0:
            return self._open
        if self._open < 0:
            self.pieces.append((self.pos, 0, len(self.meta), None))
            self._open = len(self.pieces) - 1
        off, length, mo, _ = self.pieces[self._open]
        self.pieces[self._open] = (off, length + n, mo, None)
        self.meta.extend(b)
        self.pos += n
        return self._open

    def add_tensor(self, t: torch.Tensor, nbytes: int) -> int:
        self.pieces.append((self.pos, nbytes, -1, t))
        self._open = -1
        self.pos += nbytes
        return len(self.pieces) - 1

    def full(self) -> bool:
        """Worth handing to the C core while the next part is laid out."""
        return self.items >= PART_ITEMS and self.pos - self.start >= PART_BYTES

    def close_part(self) -> None:
        """Zeros up to the next block: the next part starts at a block boundary
        (hostregFileWrite's rule for a file written in parts; DCP's readers seek each item by
        its offset, so bytes between items are read by none)."""
        self.add_bytes(bytes(-self.pos % BLOCK))

    def write(self, fd: int, threads: int, flags: int, stats: IoStats) -> None:
        base = _address(self.meta)
        seg = array.array("Q")
        for off, length, mo, t in self.pieces:
            seg.extend((off, length, base + mo if t is None else t.data_ptr()))
        pat = array.array("Q")
        for crc_of, into, offset in self.patches:
            pat.extend((crc_of, into, offset))
        got = _hostreg.file_write(
            fd, seg.buffer_info()[0], len(self.pieces), pat.buffer_info()[0], len(self.patches), threads, flags
        )
        if got[0] != 0:
            _raise_io("cannot write the checkpoint file")
        stats.add(got)


# A file of many items is written in parts of at least this many items and bytes, each part
# by the C core (the GIL released) while Python lays out the next: for 8,192 tensors of
# 128 KiB the layout is about 0.2 s, a quarter of the write, that need not come before it
# (write_data of 1 GiB: 0.82 s as one part, 0.63 s in parts of 128 MiB, min of 5 on this
# project's test machine). Parts of 128 MiB keep eight 16 MiB requests, all threads busy.
# A file of a few large tensors stays one part (one call keeps every request in flight).
PART_ITEMS = 256
PART_BYTES = 128 << 20


class _PartWriter:
    """Writes the parts of one file in order, one at a time, on a thread of its own, so that
    the caller lays out part k + 1 while part k is written. Without a thread to be had, each
    part is written on the caller's thread. ``wait()`` returns once no part is being written
    and re-raises the first failure; nothing is written after a failure."""

    def __init__(self, fd: int, threads: int, stats: IoStats) -> None:
        self._fd, self._threads, self._stats = fd, threads, stats
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def submit(self, part: _FileLayout, flags: int) -> None:
        self.wait()
        t = threading.Thread(target=self._run, args=(part, flags), name="hostreg-writer", daemon=True)
        try:
            t.start()
        except RuntimeError:  # no thread to be had: write it here
            part.write(self._fd, self._threads, flags, self._stats)
            return
        self._thread = t

    def _run(self, part: _FileLayout, flags: int) -> None:
        try:
            part.write(self._fd, self._threads, flags, self._stats)
        except BaseException as e:  # handed to the caller by wait()
            self._failure = e

    def wait(self) -> None:
        t = self._thread
        if t is not None:
            while t.is_alive():  # in slices: Ctrl-C reaches the caller meanwhile (and drain() still sees the thread)
                t.join(0.1)
            self._thread = None
        if self._failure is not None:
            raise self._failure

    def drain(self) -> None:
        """Waits for the part being written, whatever happens meanwhile (the descriptor is
        closed and the file removed after it); its failure, if any, is dropped."""
        t, self._thread = self._thread, None
        while t is not None and t.is_alive():
            try:
                t.join()
            except BaseException:  # a second Ctrl-C: the write still has the descriptor
                continue


class FileSystemWriter(StorageWriter):
    """DCP ``StorageWriter`` whose files are DCP's own format, written at the disk's speed.

    Use it as ``dcp.save(sd, storage_writer=FileSystemWriter(path))`` or
    ``dcp.async_save(sd, storage_writer=..., async_stager=hostreg.torch.Stager(...))``, with
    either async checkpointer type (it pickles) and any stager.

    Args:
        path: the checkpoint's directory (made if missing).
        single_file_per_rank: one file per rank (``__{rank}_0.distcp``); else one per item.
        sync_files: make the data durable before ``.metadata`` is written (``fdatasync`` of
            every file and ``fsync`` of the directory), and ``.metadata`` durable too
            (temporary name, ``fsync``, ``rename``, ``fsync`` of the directory).
        thread_count: requests in flight per file (threads of the C core), >= 1.
        overwrite: allow a directory that holds a checkpoint; its ``.metadata`` is removed
            before any data is written, so a save that dies half-way leaves a directory that
            does not load. ``False`` raises ``RuntimeError`` as DCP's writer does.
        direct_io: use ``O_DIRECT`` where the filesystem allows (else the page cache, said once
            in a ``hostreg`` log line).

    Tensors are written from their own memory: a hostreg arena's, or any contiguous CPU
    tensor's; other tensors are first made contiguous CPU tensors (``copied_bytes`` in
    :attr:`stats`). A tensor that ``torch.save`` would pickle otherwise (quantized, sparse, a
    dtype with no legacy storage class) is written by ``torch.save`` itself, as DCP does.
    I/O failures raise ``OSError`` with the errno (``ENOSPC``, ``EIO``) from ``write_data``,
    which DCP reports as a ``CheckpointException``; no ``.metadata`` is written then, and this
    rank's partial file is removed.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        single_file_per_rank: bool = True,
        sync_files: bool = True,
        thread_count: int = 4,
        overwrite: bool = True,
        *,
        direct_io: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(thread_count, bool) or not isinstance(thread_count, int) or thread_count < 1:
            raise ValueError(f"thread_count must be an int >= 1, got {thread_count!r}")
        self.path = os.fspath(path)
        self.single_file_per_rank = single_file_per_rank
        self.sync_files = sync_files
        self.thread_count = thread_count
        self.overwrite = overwrite
        self.direct_io = direct_io
        self.save_id = secrets.token_hex(16)
        self.rank: int | None = None
        self.use_collectives = True
        self.stats = IoStats()  #: what this rank's last write_data did

    # -- DCP's protocol --

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = os.fspath(checkpoint_id)
        self.save_id = secrets.token_hex(16)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def _metadata_path(self, rank: int | None = None) -> str:
        return os.path.join(self.path, METADATA if rank is None else f"__{rank}{METADATA}")

    def _own_metadata(self) -> str:
        return self._metadata_path(self.rank if not self.use_collectives and self.rank is not None else None)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        os.makedirs(self.path, exist_ok=True)
        meta = self._own_metadata()
        if not self.use_collectives and self.rank is not None:
            plan = dataclasses.replace(plan, storage_data=_StoragePrefix(f"__{self.rank}_"))
        if os.path.exists(meta):
            if not self.overwrite:
                raise RuntimeError(f"Checkpoint already exists and self.overwrite={self.overwrite}.")
            if not self.use_collectives:
                self._drop_metadata(meta)
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        # The coordinator, before any rank writes data: an old checkpoint here stops loading.
        self._drop_metadata(self._metadata_path())
        return [
            dataclasses.replace(p, storage_data=_StoragePrefix(f"__{i}_")) if p.storage_data is None else p
            for i, p in enumerate(plans)
        ]

    def _drop_metadata(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        if self.sync_files:
            _fsync_dir(self.path)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        prefix = plan.storage_data.prefix
        self.stats = IoStats()
        # Each item's data is resolved as its part is laid out (while the part before it is
        # being written), not all before the first byte is written.
        resolved = ((item, planner.resolve_data(item)) for item in plan.items)
        groups: Any = [resolved] if self.single_file_per_rank else ([x] for x in resolved)
        results: list[WriteResult] = []
        for n, group in enumerate(groups):
            results += self._write_file(f"{prefix}{n}{SUFFIX}", group)
        if self.sync_files:
            _fsync_dir(self.path)  # the new files' names are durable too
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.version = _DCP_VERSION
        metadata.storage_data = {wr.index: wr.storage_data for wrs in results for wr in wrs}
        metadata.storage_meta = self.storage_meta()
        final = self._own_metadata()
        tmp = final + ".tmp"
        with open(tmp, "wb") as f:
            pickle.dump(metadata, f)
            if self.sync_files:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final)
        if self.sync_files:
            _fsync_dir(self.path)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        from torch.distributed.checkpoint.filesystem import FileSystem

        return FileSystem.validate_checkpoint_id(checkpoint_id)

    # -- the file --

    def _write_file(self, name: str, items: Any) -> list[WriteResult]:
        """Lays out and writes one file of ``items`` ((WriteItem, data) pairs) in parts."""
        path = os.path.join(self.path, name)
        fd = _open_to_replace(path, self.direct_io)
        parts = _PartWriter(fd, self.thread_count, self.stats)
        try:
            results, lay = self._lay_out(name, items, parts)
            parts.submit(lay, _hostreg.IO_SYNC if self.sync_files else 0)
            parts.wait()
        except BaseException:
            parts.drain()
            try:
                os.unlink(path)  # a partial file is no part of any checkpoint
            except OSError:
                pass
            raise
        finally:
            os.close(fd)
        return results

    def _lay_out(self, name: str, items: Any, parts: _PartWriter) -> tuple[list[WriteResult], _FileLayout]:
        """Every item's container, in file order; full parts go to ``parts`` as they are laid
        out. Returns the results and the last part (not yet written)."""
        lay = _FileLayout()
        sid = f"{int(self.save_id, 16):040d}".encode()  # 40 digits, as torch.save writes its ids
        align = _container.STORAGE_ALIGNMENT
        results = []
        for item, data in items:
            if lay.full():  # handed over once another item comes: the last part is never empty
                lay.close_part()
                parts.submit(lay, _hostreg.IO_MORE)
                lay = _FileLayout(lay.pos)
            start = lay.pos
            if item.type == WriteItemType.BYTE_IO:
                lay.add_bytes(data.getbuffer())
            else:
                t = self._writable(data)
                if t is None:  # torch.save it, as DCP does
                    buf = io.BytesIO()
                    torch.save(data.detach().cpu().clone(), buf)
                    lay.add_bytes(buf.getbuffer())
                else:
                    start = self._add_tensor(lay, t, align, sid)
            lay.items += 1
            results.append(
                WriteResult(index=item.index, size_in_bytes=lay.pos - start, storage_data=_StorageInfo(name, start, lay.pos - start))
            )
        return results, lay

    def _writable(self, data: Any) -> torch.Tensor | None:
        """A contiguous CPU tensor with ``data``'s values, or None for torch.save's own path."""
        t = data.detach()
        if not _container.encodable(t):
            return None
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        if t.device.type != "cpu" or not t.is_contiguous():
            t = t.cpu().contiguous()  # not Tensor.to(memory_format=...): that returns a CPU tensor as it is
            self.stats.copied_bytes += t.numel() * t.element_size()
        return t

    @staticmethod
    def _add_tensor(lay: _FileLayout, t: torch.Tensor, align: int, sid: bytes) -> int:
        nbytes = t.numel() * t.element_size()
        ptr = t.data_ptr() if nbytes else 0
        start = lay.pos + (ptr - lay.pos) % align  # the data's offset in the container: a multiple of align
        lay.add_bytes(bytes(start - lay.pos))
        step = BLOCK if nbytes >= MIN_DIRECT else align  # congruent to memory: O_DIRECT from it

        def data_at(first: int) -> int:
            at = first + (ptr - first) % step
            return at + step if 0 < at - first < 4 else at

        c = _container.layout(_container.tensor_pickle(t.dtype, tuple(t.shape)), nbytes, start, data_at, sid)
        lay.add_bytes(c.head)
        if nbytes == 0:
            lay.add_bytes(c.tail)  # its CRC fields hold 0, the CRC-32 of no bytes
            return start
        data = lay.add_tensor(t, nbytes)
        tail_piece = lay.add_bytes(c.tail)
        for at in c.crc_at:
            lay.patches.append((data, tail_piece, at))
        return start


# ---- Reader ----------------------------------------------------------------------------------

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
        done: list[tuple[Any, torch.Tensor, torch.Tensor | None]] = []  # (req, destination, staged view to copy or None)
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
        from ._arena import Arena
        from .._errors import StagingError

        try:
            arena = Arena(nbytes + extra, pin=True, share=False)
            raw = arena.view(0, (nbytes + extra,), torch.uint8)
        except StagingError:
            raw = None
    if raw is None:
        raw = torch.empty(nbytes + extra, dtype=torch.uint8)
    shift = (file_offset - raw.data_ptr()) % BLOCK
    return raw[shift:shift + nbytes]
