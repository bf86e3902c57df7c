"""One checkpoint file laid out in parts (:class:`_FileLayout`), each written by the C core on
a thread of its own (:class:`_PartWriter`) while Python lays out the next."""

from __future__ import annotations

import array
import threading
from typing import Any, Protocol

import torch

from ... import _hostreg
from .files import BLOCK, IoStats, _address, _raise_io


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


class _Part(Protocol):
    """What :class:`_PartWriter` writes: a :class:`_FileLayout`, or a fixed part (``fixed.py``)."""

    def write(self, fd: int, threads: int, flags: int, stats: IoStats) -> None: ...


class _PartWriter:
    """Writes the parts of one file in order, one at a time, on a thread of its own, so that
    the caller lays out part k + 1 while part k is written. Without a thread to be had, each
    part is written on the caller's thread. ``wait()`` returns once no part is being written
    and re-raises the first failure; nothing is written after a failure."""

    def __init__(self, fd: int, threads: int, stats: IoStats) -> None:
        self._fd, self._threads, self._stats = fd, threads, stats
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def submit(self, part: _Part, flags: int) -> None:
        self.wait()
        t = threading.Thread(target=self._run, args=(part, flags), name="hostreg-writer", daemon=True)
        try:
            t.start()
        except RuntimeError:  # no thread to be had: write it here
            part.write(self._fd, self._threads, flags, self._stats)
            return
        self._thread = t

    def _run(self, part: _Part, flags: int) -> None:
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
