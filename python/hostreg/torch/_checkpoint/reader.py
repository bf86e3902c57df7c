"""DCP ``StorageReader`` for DCP's own file format at the disk's speed (docs/checkpoint.md)."""

from __future__ import annotations

import array
import contextlib
import ctypes
import dataclasses
import functools
import inspect
import io
import os
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader as _StockReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.futures import Future

from ... import _hostreg
from .._collector import collector_paused
from . import container_read as _container
from . import metadata_read as _metadata_read
from . import read_chunks as _chunks
from .files import BLOCK, METADATA, IoStats, _address, _open, _raise_io, check_threads, threads_for
from .load_planner import RowItems
from .load_planner import destinations as _destinations
from .read_rows import serve_rows

_STOCK_ARGS = frozenset(inspect.signature(_StockReader.__init__).parameters)  # the installed torch's

HEAD = 4096  # bytes read from a container's start: its pickle and headers
TAIL = 4096  # and from its end: the central directory
WHOLE = 1 << 20  # containers up to this size are read whole in the first pass (data included)


class FileSystemReader(_StockReader):
    """DCP ``StorageReader`` for checkpoints of DCP's ``FileSystemWriter`` and hostreg's.

    ``dcp.load(sd, storage_reader=FileSystemReader(path))``. A subclass of DCP's
    ``FileSystemReader`` taking its arguments in its order (``path``, ``_extension_registry``:
    the stream transforms' registry, handed to DCP's reader for the items that have them), and
    hostreg's own keyword-only after them. Each file is read with
    ``O_DIRECT`` (where the filesystem allows) by ``thread_count`` threads of the C core
    (``hostregFileRead``; None, the default, chooses per disk as the writer does): first the containers' headers, then every tensor's bytes, straight
    into a contiguous CPU destination of the same dtype (the only copy is from a bounce
    buffer where file and memory alignment differ), or into one staging buffer and from there
    into the destination (non-blocking for accelerator destinations, from page-locked memory
    where hostreg can register it). Resharding works as with DCP's reader: read items narrow
    the stored tensors. Items with stream transforms, or containers that are not a plain
    tensor's, go to DCP's own reader. A truncated or unreadable file raises ``OSError``.

    A checkpoint is input: ``.metadata`` is unpickled admitting only the types DCP's metadata
    is made of (``UntrustedMetadataError`` for anything else: unpickling it could run code),
    unless ``trusted=True``; entries whose file is not a plain file of the directory, or whose
    offsets are not byte counts, raise ``ValueError`` naming the item (``metadata_read.py``).

    ``verify=True`` checks every byte of each file a load reads before reading from it (each
    container's ZIP structure and each record's CRC-32, zeros between containers:
    ``verify.py``, as ``hostreg verify`` does) and raises ``CorruptCheckpointError`` (a
    ``ValueError``) naming the file, the tensor and the byte offset of each difference. The
    files are then read through the page cache the check filled. ``.metadata`` written by
    hostreg is checked against its CRC-32 at every load, verify or not.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        _extension_registry: Any = None,
        *,
        thread_count: int | None = None,
        direct_io: bool = True,
        trusted: bool = False,
        verify: bool = False,
    ) -> None:
        if _extension_registry is not None and not hasattr(_extension_registry, "from_descriptor_list"):
            raise TypeError(
                f"FileSystemReader's second argument is DCP's _extension_registry (an ExtensionRegistry), not "
                f"{type(_extension_registry).__name__}; hostreg's thread_count is a keyword: thread_count=..."
            )
        if _extension_registry is None:
            super().__init__(path)
        elif "_extension_registry" in _STOCK_ARGS:
            super().__init__(path, _extension_registry)
        else:
            raise ValueError(
                f"FileSystemReader(_extension_registry=...): DCP's FileSystemReader of torch {torch.__version__} takes "
                "no _extension_registry (its checkpoints have no stream transforms); leave it out"
            )
        check_threads(thread_count)
        self.thread_count = thread_count
        self.direct_io = direct_io
        self.trusted = trusted
        self.verify = verify
        self.stats = IoStats()

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        with collector_paused():
            return self._read_data(plan, planner)

    def _read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        self.stats = IoStats()
        items: Any = plan.items
        reads: list[Any] = items
        rows: list[int] = []
        # A plan of hostreg's LoadPlanner from this reader's index (index.py): its whole
        # tensors are rows of the index, read without making their ReadItems (read_rows.py).
        index = getattr(self, "_index", None)
        if (
            index is not None
            and isinstance(items, RowItems)
            and items.metadata_index is index
            and _destinations(planner, []) is not None
        ):
            rows = [s for s in items.slots if type(s) is int]
            reads = [s for s in items.slots if type(s) is not int]
        if self.verify:
            files = {self.storage_data[r.storage_index].relative_path for r in reads}
            if rows:
                first, file = index.columns()[:2]  # type: ignore[union-attr]
                files.update(index.files[f] for f in file[first[torch.tensor(rows)]].unique().tolist())  # type: ignore[union-attr]
            self._verify(files)
        per_file: dict[str, tuple[list[Any], list[Any]]] = {}  # relative path -> (reads, their items' _StorageInfo)
        slow: list[Any] = []
        self._group(reads, per_file, slow)
        if rows:
            commit = None
            if type(planner).commit_tensor is not DefaultLoadPlanner.commit_tensor:  # DCP's does nothing
                commit = lambda r, t: planner.commit_tensor(items._item(r), t)  # noqa: E731
            others = {rel: _metadata_read.spans_of(reqs, infos) for rel, (reqs, infos) in per_file.items()}
            directory = os.fspath(self.path)
            left = serve_rows(
                index, rows, planner.state_dict, directory, self._opened, self._read_rows, commit, WHOLE, others
            )
            self._group(map(items._item, left), per_file, slow)
        for rel, (reqs, infos) in per_file.items():
            slow += self._read_file(os.path.join(os.fspath(self.path), rel), reqs, infos, planner)
        if slow:
            super().read_data(dataclasses.replace(plan, items=slow), planner).wait()
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _group(self, reads: Any, per_file: dict[str, tuple[list[Any], list[Any]]], slow: list[Any]) -> None:
        """Adds ``reads`` to ``per_file`` (relative path -> (reads, their _StorageInfo)), those
        with stream transforms to ``slow`` (DCP's reader reads them)."""
        for req in reads:
            info = self.storage_data[req.storage_index]
            if getattr(info, "transform_descriptors", None):
                slow.append(req)
                continue
            reqs, infos = per_file.setdefault(info.relative_path, ([], []))
            reqs.append(req)
            infos.append(info)

    @contextlib.contextmanager
    def _opened(self, path: str) -> Iterator[int]:
        """A descriptor of the checkpoint file ``path`` to read it (``O_DIRECT`` where asked
        for, unless a verified file is read from the page cache the check filled), closed after."""
        fd = _open(path, os.O_RDONLY, self.direct_io and not self.verify)
        try:
            yield fd
        finally:
            os.close(fd)

    def _verify(self, files: set[str]) -> None:
        """``verify=True``: raises ``CorruptCheckpointError`` naming each problem (up to 20)
        of ``files`` (every byte: ``verify.py``) before anything is read from them."""
        from .verify import CorruptCheckpointError, Report, check_files

        report = Report([], 0, 0, 0, [])
        check_files(os.fspath(self.path), self._metadata, files, 0, report)
        if report.problems:
            shown = "; ".join(map(str, report.problems[:20]))
            more = f" (and {len(report.problems) - 20} more)" if len(report.problems) > 20 else ""
            raise CorruptCheckpointError(f"{os.fspath(self.path)} is not what was saved: {shown}{more}")

    def _transfer(self, fd: int, segments: list[tuple[int, int, int]]) -> None:
        """Reads ``segments`` ((file offset, bytes, address), any order) of ``fd``."""
        segments.sort()
        seg = array.array("Q")
        for s in segments:
            seg.extend(s)
        self._read_array(fd, seg.buffer_info()[0], len(segments))

    def _read_rows(self, fd: int, segments: torch.Tensor) -> None:
        """Reads ``segments`` (int64, shape (k, 3): file offset, bytes, address; in file order)."""
        segments = segments.contiguous()
        self._read_array(fd, segments.data_ptr(), len(segments))

    def _read_array(self, fd: int, address: int, count: int) -> None:
        got = _hostreg.file_read(fd, address, count, threads_for(os.fspath(self.path), self.thread_count))
        if got[0] != 0:
            _raise_io("cannot read the checkpoint file")
        self.stats.add(got)

    def _read_file(self, path: str, reqs: Any, infos: list[Any], planner: LoadPlanner) -> list[Any]:
        """Serves ``reqs`` (``infos``: where each one's item lies) from one file; returns those
        left to DCP's reader."""
        with self._opened(path) as fd:
            _metadata_read.check_ranges(os.path.basename(path), os.fstat(fd).st_size, reqs, infos)
            return self._serve(fd, reqs, infos, planner)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        """The checkpoint's ``Metadata``: ``.metadata``, or with ``rank=`` (DCP's fallback for a
        save without collectives) ``__{rank}.metadata``; unpickled as data unless the reader
        is ``trusted`` (``metadata_read.py``). ``FileNotFoundError`` where it is missing,
        ``UntrustedMetadataError`` where it is damaged or names other types."""
        rank = kwargs.get("rank")
        path = os.path.join(os.fspath(self.path), METADATA if rank is None else f"__{rank}{METADATA}")
        # Unpickling makes about 15 objects per item, which set off full collections over them
        # all (half its time for 65,536 items): paused.
        with collector_paused():
            metadata = _metadata_read.load_metadata(path, self.trusted)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        if hasattr(self, "load_id"):  # as DCP's reader does (torch >= 2.5)
            metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        _metadata_read.check_storage(metadata, os.fspath(self.path))
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._metadata = metadata  # each stored chunk's dtype and shape (the fast check of a container)
        self._index = getattr(metadata.storage_data, "index", None)  # where read_metadata found one (index.py)

    def _stored_as(self, index: Any) -> tuple[torch.dtype, tuple[int, ...]] | None:
        """The dtype and shape the metadata gives the stored chunk ``index``, or None."""
        tmd = getattr(getattr(self, "_metadata", None), "state_dict_metadata", {}).get(index.fqn)
        chunks = getattr(tmd, "chunks", None)
        if not chunks:
            return None
        i = index.index
        if i is None or i >= len(chunks) or (index.offset is not None and chunks[i].offsets != index.offset):
            if len(chunks) == 1 and index.offset is None:
                return tmd.properties.dtype, tuple(chunks[0].sizes)  # type: ignore[union-attr]
            i = next((j for j, c in enumerate(chunks) if c.offsets == index.offset), None)
            if i is None:
                return None
        return tmd.properties.dtype, tuple(chunks[i].sizes)  # type: ignore[union-attr]

    def _serve(self, fd: int, reqs: list[Any], infos: list[Any], planner: LoadPlanner) -> list[Any]:
        # Containers are told apart by their _StorageInfo object (one per stored item: an int
        # to hash, not a MetadataIndex). Byte items and small containers are read whole, a
        # chunk at a time (read_chunks.py); of each larger one its first and last bytes, then
        # the tensor's bytes, straight into its destination or a staging buffer.
        byte_io = LoadItemType.BYTE_IO
        small: dict[int, Any] = {}
        large: dict[int, Any] = {}
        items_of: dict[int, list[int]] = {}  # id(info) -> the items read from it
        kinds = [req.type for req in reqs]
        dests = _destinations(planner, reqs)  # whole plain tensors' destinations at once, or None
        for i, (kind, info) in enumerate(zip(kinds, infos)):
            got = items_of.get(id(info))
            if got is None:
                items_of[id(info)] = got = []
                (small if kind == byte_io or info.length <= WHOLE else large)[id(info)] = info
            got.append(i)
        commit = type(planner).commit_tensor is not DefaultLoadPlanner.commit_tensor  # DCP's does nothing
        slow: list[Any] = []
        read = functools.partial(self._transfer, fd)
        with contextlib.closing(_chunks.chunks_read(_chunks.plan_chunks(list(small.values())), read)) as chunks:
            for chunk, buf, base, at in chunks:
                idx = [i for info in chunk for i in items_of[id(info)]]
                rest = idx if dests is None else _chunks.serve_whole(buf, base, idx, infos, at, dests)
                if commit and len(rest) < len(idx):
                    left = set(rest)
                    for i in idx:
                        if i not in left:
                            planner.commit_tensor(reqs[i], dests[i])  # type: ignore[index]
                for i in rest:
                    req, info = reqs[i], infos[i]
                    where = at[id(info)]
                    if kinds[i] == byte_io:
                        raw = bytes(buf[where : where + info.length])
                        if not self.trusted:
                            _metadata_read.check_bytes_item(req.storage_index.fqn, raw)
                        planner.load_bytes(req, io.BytesIO(raw))
                        continue
                    known = self._stored_as(req.storage_index)
                    st = None if known is None else _container.written_by_hostreg(buf, where, info.length, *known)
                    if st is None:
                        raw = bytes(buf[where : where + info.length])
                        st = _container.parse(raw, raw, info.length)
                    if st is None:
                        slow.append(req)
                        continue
                    _, target, view = self._place(info, st, req, planner, [], (buf, where))
                    if view is not None:
                        target.copy_(view)  # at once and blocking: the chunk's buffer is reused
                    planner.commit_tensor(req, target)
        if large:
            slow += self._serve_large(fd, reqs, infos, large, items_of, planner)
        return slow

    def _serve_large(
        self, fd: int, reqs: list[Any], infos: list[Any], large: dict[int, Any], items_of: dict, planner: LoadPlanner
    ) -> list[Any]:
        """Serves the items of containers over ``WHOLE`` bytes (``large``: id -> _StorageInfo):
        their first and last bytes read, the tensor found, its bytes read straight into the
        destination or a staging buffer. Returns the items left to DCP's reader."""
        windows = {k: (bytearray(HEAD), bytearray(TAIL)) for k in large}
        segs = []
        for k, info in large.items():
            head, tail = windows[k]
            segs.append((info.offset, HEAD, _address(head)))
            segs.append((info.offset + info.length - TAIL, TAIL, _address(tail)))
        self._transfer(fd, segs)
        slow: list[Any] = []
        segs = []  # (file offset, bytes, address): what the second read fills
        done: list[tuple[Any, torch.Tensor, torch.Tensor | None]] = []  # (req, destination, staged view or None)
        for k, info in large.items():
            st = _container.parse(*windows[k], info.length)
            for i in items_of[k]:
                if st is None:
                    slow.append(reqs[i])
                else:
                    done.append(self._place(info, st, reqs[i], planner, segs, None))
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
        self, info: Any, st: Any, req: Any, planner: LoadPlanner, segs: list, whole: tuple[Any, int] | None
    ) -> tuple[Any, torch.Tensor, torch.Tensor | None]:
        """Plans where the bytes of read item ``req`` go (appended to ``segs``): straight into its
        destination when that is one byte range of the stored tensor and a contiguous CPU tensor
        of its dtype; else the covering rows into a staging buffer. A container already read
        ``whole`` (a buffer and the container's offset in it) is copied from there instead:
        at once into such a destination, else later from a view of it. Returns (req,
        destination, the view to copy into it after the read, or None)."""
        itemsize = st.dtype.itemsize
        shape = st.shape
        offs = tuple(req.storage_offsets)
        lens = tuple(req.lengths)
        row = itemsize
        for n in shape[1:]:
            row *= n
        base = info.offset + st.data_offset + st.storage_offset * itemsize
        if (
            len(offs) != len(shape)
            or len(lens) != len(shape)
            or any(o < 0 or n < 0 or o + n > s for o, n, s in zip(offs, lens, shape))
        ):
            raise ValueError(
                f"{req.storage_index.fqn}: the metadata reads offsets {offs}, lengths {lens} of a stored tensor "
                f"whose container ({info.relative_path}, byte {info.offset}) holds shape {shape}"
            )
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
        direct = (
            inner_full
            and target.device.type == "cpu"
            and target.dtype == st.dtype
            and target.is_contiguous()
            and not (target.is_conj() or target.is_neg())
        )
        if whole is not None:
            buf, at = whole
            if off - info.offset + nbytes > info.length:
                raise ValueError(
                    f"{req.storage_index.fqn}: its bytes would lie past its container ({info.relative_path}, byte "
                    f"{info.offset}, {info.length} bytes): the container is damaged"
                )
            at += off - info.offset
            if nbytes == 0:
                return req, target, None
            if direct:
                ctypes.memmove(target.data_ptr(), _address(buf) + at, nbytes)
                return req, target, None
            view = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=at)
            return req, target, self._rows(view, st, rows, offs, lens)
        if direct:
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
