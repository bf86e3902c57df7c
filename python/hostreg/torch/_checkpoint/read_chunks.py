"""The reader's small containers, read a bounded chunk at a time (docs/checkpoint.md).

Containers up to ``reader.WHOLE`` bytes are read whole: a tensor's header and data in one
request. They are packed into chunks of about :data:`CHUNK` bytes in file order, read by the C
core into one of two buffers that alternate, the next chunk being read by a background thread
while the caller serves the one before. So a load holds at most two chunks of such containers
in memory, whatever the checkpoint's size, and the disk is not idle while Python works.
:func:`cut` and :func:`pipelined` serve both kinds of reads: the ``ReadItem`` s here
(:func:`chunks_read`, :func:`serve_whole`) and the rows of an index (``read_rows.py``).
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from .._copy import copy_batch
from .._layout import dtype_of, is_cpu
from . import container_read as _container
from .files import _address

CHUNK = 64 << 20  # bytes of containers a chunk holds (one larger container makes a chunk alone)

# One chunk: its containers' _StorageInfo objects, and their total length in bytes.
Chunk = tuple[list[Any], int]


def cut(lengths: list[int]) -> list[tuple[int, int, int]]:
    """Consecutive runs of ``lengths`` (containers in file order) as chunks: (first, stop,
    bytes), each of up to :data:`CHUNK` bytes (a container longer than that alone)."""
    out: list[tuple[int, int, int]] = []
    first = size = 0
    limit = CHUNK
    for k, n in enumerate(lengths):
        if k > first and size + n > limit:
            out.append((first, k, size))
            first, size = k, 0
        size += n
    if first < len(lengths):
        out.append((first, len(lengths), size))
    return out


def plan_chunks(infos: list[Any]) -> list[Chunk]:
    """``infos`` (distinct containers) in file order, cut into chunks (:func:`cut`)."""
    ordered = sorted(infos, key=lambda i: (i.relative_path, i.offset))
    return [(ordered[a:b], n) for a, b, n in cut([i.length for i in ordered])]


Read = Callable[[list[tuple[int, int, int]]], None]


def pipelined(sizes: list[int], fill: Callable[[int, Any, int], Any]) -> Generator[tuple[Any, int, Any], None, None]:
    """Yields, for each chunk ``k`` (``sizes[k]`` bytes), (the buffer holding it, the buffer's
    address, what ``fill(k, buffer, address)`` returned once it read the chunk into the
    buffer). The next chunk is filled by a background thread while the caller holds this one
    (in turn where no thread can be started); two buffers alternate, so the caller copies out
    what it needs before asking for the next. Closing the iterator (or an exception in the
    caller, e.g. Ctrl-C, with the iterator closed by ``contextlib.closing``) waits for a fill
    in flight before its buffer can go."""
    buffers: list[Any] = [None, None]
    cap = max(sizes, default=0) or 1  # each buffer holds any chunk

    def read(k: int) -> tuple[Any, int, Any]:
        buf = buffers[k % 2]
        if buf is None:
            # An anonymous mapping: the kernel zeroes its pages as the read first touches them
            # (a bytearray of a few hundred MiB spent longer zeroing itself than the read took).
            buf = buffers[k % 2] = mmap.mmap(-1, cap)
        base = _address(buf)
        return buf, base, fill(k, buf, base)

    pool: ThreadPoolExecutor | None = None
    if len(sizes) > 1:
        try:
            pool = ThreadPoolExecutor(1, thread_name_prefix="hostreg-read")
        except RuntimeError:
            pool = None
    ahead: Future | None = None
    try:
        for k in range(len(sizes)):
            if pool is not None:
                if ahead is None:
                    ahead = pool.submit(read, k)
                got = ahead.result()
                ahead = None
                if k + 1 < len(sizes):
                    try:
                        ahead = pool.submit(read, k + 1)
                    except RuntimeError:  # no thread could be started: read the rest in turn
                        pool.shutdown(wait=True)
                        pool = None
            else:
                got = read(k)
            yield got
    finally:
        if pool is not None:
            pool.shutdown(wait=True)  # a read in flight ends before its buffer may be freed


def chunks_read(
    chunks: list[Chunk], transfer: Read
) -> Generator[tuple[list[Any], Any, int, dict[int, int]], None, None]:
    """Yields each chunk once read (:func:`pipelined`): (its containers, the buffer holding
    them, the buffer's address, {id(info): the container's offset in the buffer}).
    ``transfer`` reads a list of (file offset, bytes, address) segments."""

    def fill(k: int, buf: Any, base: int) -> dict[int, int]:
        at: dict[int, int] = {}
        segs = []
        off = 0
        for info in chunks[k][0]:
            at[id(info)] = off
            if info.length:
                segs.append((info.offset, info.length, base + off))
            off += info.length
        transfer(segs)
        return at

    reads = pipelined([size for _, size in chunks], fill)
    try:
        for k, (buf, base, at) in enumerate(reads):
            yield chunks[k][0], buf, base, at
    finally:
        reads.close()


def serve_whole(buf: Any, base: int, idx: list[int], infos: list[Any], at: dict[int, int], dests: list) -> list[int]:
    """Copies, with one ``hostregCopyBatch``, the items ``idx`` whose destination (``dests``,
    the planner's: a plain tensor read whole, else None) is a contiguous CPU tensor and whose
    container (``infos[i]``, at ``at[id(info)]`` in ``buf``, whose address is ``base``) is laid
    out as hostreg's writer lays out a tensor of that dtype and shape
    (``container_read.data_offset``). Returns the items it did not serve.

    Runs of containers of one pattern and length that follow each other in ``buf`` (what the
    writer makes of a model's layers) are checked at once (:func:`_check_run`); the others one
    by one."""
    mine = [i for i in idx if dests[i] is not None]
    if not mine:
        return idx
    ts = [dests[i] for i in mine]
    plain = torch.Tensor
    ok = map(
        lambda c, contiguous, conj, neg: c and contiguous and not conj and not neg,
        map(is_cpu, ts),
        map(plain.is_contiguous, ts),
        map(plain.is_conj, ts),
        map(plain.is_neg, ts),
    )
    # The candidates, in buf's order: item, pattern, container offset in buf and length,
    # destination address. The runs are cut from them.
    items: list[int] = []
    pats: list[Any] = []
    wheres: list[int] = []
    lengths: list[int] = []
    ptrs: list[int] = []
    pattern = _container.pattern
    last: tuple = (None, None, None)  # (dtype, shape, pattern) of the item before: most repeat it
    for i, good, dtype, shape, ptr in zip(mine, ok, map(dtype_of, ts), map(plain.size, ts), map(plain.data_ptr, ts)):
        if not good:
            continue
        if dtype is last[0] and shape == last[1]:
            pat = last[2]
        else:
            pat = pattern(dtype, shape)
            last = (dtype, shape, pat)
        if pat is None:
            continue
        info = infos[i]
        items.append(i)
        pats.append(pat)
        wheres.append(at[id(info)])
        lengths.append(info.length)
        ptrs.append(ptr)
    served: set[int] = set()
    dst: list[int] = []
    src: list[int] = []
    nbytes: list[int] = []
    whole = None
    n = len(items)
    k = 0
    data_offset = _container.data_offset
    while k < n:
        pat, where, length = pats[k], wheres[k], lengths[k]
        end = k + 1
        while end < n and pats[end] is pat and lengths[end] == length and wheres[end] == where + (end - k) * length:
            end += 1
        rel = data_offset(buf, where, length, pat)
        good_rows = None
        if end - k >= _RUN and rel >= 0:
            if whole is None:
                whole = torch.frombuffer(buf, dtype=torch.uint8)
            good_rows = _check_run(whole[where : where + (end - k) * length].view(end - k, length), rel, pat)
        if good_rows is not None and all(good_rows):  # the whole run at once
            served.update(items[k:end])
            if pat.nbytes:
                dst += ptrs[k:end]
                first = base + where + rel
                src += range(first, first + (end - k) * length, length)
                nbytes += [pat.nbytes] * (end - k)
            k = end
            continue
        for j in range(k, end):
            if good_rows is not None:
                data = rel if good_rows[j - k] else -1
            else:
                data = rel if j == k else data_offset(buf, wheres[j], lengths[j], pats[j])
            if data < 0:
                continue
            served.add(items[j])
            if pats[j].nbytes:
                dst.append(ptrs[j])
                src.append(base + wheres[j] + data)
                nbytes.append(pats[j].nbytes)
        k = end
    if dst:
        copy_batch(dst, src, nbytes, 0)  # StagingError where a destination went away meanwhile
    return [i for i in idx if i not in served] if served else idx


_RUN = 16  # containers in a row checked at once from this many on


def _check_run(rows: torch.Tensor, rel: int, pat: Any) -> list[bool]:
    """Which containers of ``rows`` (k x length bytes: k containers of ``pat`` that follow each
    other, the first found good by ``data_offset`` with its data at ``rel``) are laid out as the
    first: the same bytes up to the data (records before it, the data record's local header and
    its padding, which carries no CRC: bit 3 puts CRC and sizes after the data), and after the
    data a descriptor with the same signature and sizes (its CRC differs from tensor to tensor).
    What ``data_offset`` checks of each, in one comparison over them all."""
    head = (rows[:, :rel] == rows[0, :rel]).all(1)
    desc = rel + pat.nbytes
    sig = rows[:, desc : desc + 4] == rows[0, desc : desc + 4]
    sizes = rows[:, desc + 8 : desc + pat.desc.size] == rows[0, desc + 8 : desc + pat.desc.size]
    good: list[bool] = (head & sig.all(1) & sizes.all(1)).tolist()
    return good
