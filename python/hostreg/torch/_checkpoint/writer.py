"""DCP ``StorageWriter`` of DCP's own file format at the disk's speed (docs/checkpoint.md)."""

from __future__ import annotations

import dataclasses
import inspect
import io
import os
import re
import secrets
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemWriter as _StockWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo, _StoragePrefix  # DCP's own records of where items lie
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ... import _hostreg
from .._collector import collector_paused
from . import container as _container
from . import fixed as _fixed
from .files import (
    _DCP_VERSION,
    BLOCK,
    METADATA,
    MIN_DIRECT,
    SUFFIX,
    IoStats,
    _fsync_dir,
    _open_to_replace,
    check_threads,
    threads_for,
)
from .metadata_file import Results, metadata_bytes
from .metadata_read import trailer
from .parts import _FileLayout, _PartWriter

_RANK_METADATA = re.compile(r"__\d+" + re.escape(METADATA))  # a rank's own, of a save without collectives

# The arguments DCP's FileSystemWriter takes in the installed torch (2.4 has no _extensions or
# serialization_format), and its format enum where it has one (torch >= 2.8).
_STOCK_ARGS = frozenset(inspect.signature(_StockWriter.__init__).parameters)
try:
    from torch.distributed.checkpoint.filesystem import SerializationFormat

    _TORCH_SAVE: Any = SerializationFormat.TORCH_SAVE
except ImportError:
    _TORCH_SAVE = None


class FileSystemWriter(_StockWriter):
    """DCP ``StorageWriter`` whose files are DCP's own format, written at the disk's speed.

    Use it as ``dcp.save(sd, storage_writer=FileSystemWriter(path))`` or
    ``dcp.async_save(sd, storage_writer=..., async_stager=hostreg.torch.Stager(...))``, with
    either async checkpointer type (it pickles) and any stager. A subclass of DCP's
    ``FileSystemWriter``, taking its arguments in its order (torch 2.13's; the installed
    torch's where it has fewer), hostreg's own keyword-only after them; so it is also DCP's
    ``AsyncStager``: without ``async_stager=``, ``dcp.async_save`` stages with it as with DCP's
    writer (``cache_staged_state_dict``).

    Args:
        path: the checkpoint's directory (made if missing).
        single_file_per_rank: one file per rank (``__{rank}_0.distcp``); else one per item.
        sync_files: make the data durable before ``.metadata`` is written (``fdatasync`` of
            every file and ``fsync`` of the directory), and ``.metadata`` durable too
            (temporary name, ``fsync``, ``rename``, ``fsync`` of the directory).
        thread_count: requests in flight per file (threads of the C core), >= 1; None (the
            default, where DCP's is 1) chooses per disk: 8, or 2 on a rotational disk
            (``files.threads_for``).
        per_thread_copy_ahead: DCP's queue of tensors copied off the accelerator ahead of its
            writer threads; accepted and without effect here: each tensor is written from its
            own memory, or from one contiguous CPU copy made as its turn comes.
        cache_staged_state_dict: as DCP's: when this writer is the stager of
            ``dcp.async_save`` (no ``async_stager=``), keep the staged copy for the next save.
        overwrite: allow a directory that holds a checkpoint; every metadata file that
            describes a file about to change (``.metadata``, ``__{rank}.metadata``) is removed
            before any data is written, so a save that dies half-way leaves a directory that
            loads the old checkpoint's untouched ranks or nothing, never a mix. ``False`` raises ``RuntimeError`` as DCP's writer does.
        _extensions: DCP's stream transforms (e.g. ``ZStandard``). Given (non-empty), the save
            is DCP's own writer's, transforms and all: hostreg's writes raw ``torch.save``
            containers only.
        serialization_format: DCP's ``SerializationFormat``; ``TORCH_SAVE`` (the default) is
            hostreg's; any other (``SAFETENSORS``) makes the save DCP's own writer's, as above.
        direct_io: use ``O_DIRECT`` where the filesystem allows (else the page cache, said once
            in a ``hostreg`` log line).

    ``_extensions`` or ``serialization_format`` that the installed torch's writer does not take
    raise ``ValueError`` naming them (at their defaults they are accepted on any torch).

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
        thread_count: int | None = None,
        per_thread_copy_ahead: int = 10_000_000,
        cache_staged_state_dict: bool = False,
        overwrite: bool = True,
        _extensions: Any = None,
        serialization_format: Any = _TORCH_SAVE,
        *,
        direct_io: bool = True,
    ) -> None:
        check_threads(thread_count)
        if type(per_thread_copy_ahead) is not int or per_thread_copy_ahead < 0:  # a bool is a moved overwrite=
            raise TypeError(
                f"FileSystemWriter's fifth argument is DCP's per_thread_copy_ahead (bytes, an int >= 0), not "
                f"{per_thread_copy_ahead!r}; overwrite= is the seventh: pass it by keyword"
            )
        stock: dict[str, Any] = {
            "single_file_per_rank": single_file_per_rank,
            "sync_files": sync_files,
            "thread_count": thread_count or 1,
            "per_thread_copy_ahead": per_thread_copy_ahead,
            "cache_staged_state_dict": cache_staged_state_dict,
            "overwrite": overwrite,
            "_extensions": _extensions,
            "serialization_format": serialization_format,
        }
        for name, default in (("_extensions", None), ("serialization_format", _TORCH_SAVE)):
            if name not in _STOCK_ARGS:
                if stock[name] is not default and not (name == "_extensions" and not stock[name]):
                    raise ValueError(
                        f"FileSystemWriter({name}=...): DCP's FileSystemWriter of torch {torch.__version__} takes no "
                        f"{name}; leave it out, or use a torch whose writer has it"
                    )
                del stock[name]
        super().__init__(path, **stock)
        #: The save is DCP's own writer's (``_extensions``, a format other than torch.save).
        self.stock = bool(_extensions) or (serialization_format is not _TORCH_SAVE and serialization_format is not None)
        self.thread_count = stock["thread_count"] if self.stock else thread_count
        self.direct_io = direct_io
        self.save_id = secrets.token_hex(16)
        self.rank: int | None = None
        self.use_collectives = True
        self.stats = IoStats()  #: what this rank's last write_data did
        self._stager: Any = None  # stage()'s, with cache_staged_state_dict

    # -- DCP's AsyncStager (where dcp.async_save stages with the writer) --

    def stage(self, state_dict: Any) -> Any:
        """A CPU copy of ``state_dict`` for ``dcp.async_save`` (DCP's ``AsyncStager.stage``,
        used where no ``async_stager=`` is given). With ``cache_staged_state_dict`` the copy
        lives in a shared hostreg arena, page-locked by hostreg, made by the first save and
        reused by later ones of the same structure (also with the process checkpointer, which
        receives a shared arena without a copy) (two arenas at most: one may still be
        written while the next save stages); DCP's own writer pins with ``Tensor.pin_memory()``
        there, which raises on a host without an accelerator. Without it, DCP's: a fresh copy
        each save. :meth:`close` releases the arenas. Raises as
        :meth:`hostreg.torch.Stager.stage` does."""
        if self.stock or not self.cache_staged_state_dict:
            return super().stage(state_dict)
        self.per_thread_copy_ahead = 0  # as DCP's writer does once it stages
        if self._stager is None:
            from .._stager import Stager

            self._stager = Stager(pin_memory=True, share_memory=True, max_buffers=2)
        return self._stager.stage(state_dict)

    def close(self) -> None:
        """Releases what :meth:`stage` staged into (DCP's ``AsyncStager.close``). Idempotent."""
        stager, self._stager = self._stager, None
        if stager is not None:
            stager.close()

    def __getstate__(self) -> dict[str, Any]:
        # Pickled for the process-based async checkpointer: the arenas stay in this process.
        state = self.__dict__.copy()
        state["_stager"] = None
        return state

    # -- DCP's protocol (DCP's own writer's where ``stock``) --

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if self.stock:
            return super().reset(checkpoint_id)
        if checkpoint_id:
            self.path = self.fs.init_path(checkpoint_id)
        self.save_id = secrets.token_hex(16)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self.stock:
            return super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self.rank = kwargs.get("rank")
        self.use_collectives = kwargs.get("use_collectives", True)

    def _metadata_path(self, rank: int | None = None) -> str:
        return os.path.join(self.path, METADATA if rank is None else f"__{rank}{METADATA}")

    def _own_metadata(self) -> str:
        return self._metadata_path(self.rank if not self.use_collectives and self.rank is not None else None)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        if self.stock:
            return super().prepare_local_plan(plan)
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
        if self.stock:
            return super().prepare_global_plan(plans)
        # The coordinator, before any rank writes data: an old checkpoint here stops loading.
        # With collectives every rank's file is about to change, so every rank's own metadata
        # (``__{rank}.metadata``, of a save without collectives, which dcp.load falls back to
        # where ``.metadata`` is missing) goes too; without, each rank runs this for itself and
        # removed its own in prepare_local_plan (another rank's may be new).
        doomed = [self._metadata_path()]
        if self.use_collectives:
            doomed += [os.path.join(self.path, n) for n in os.listdir(self.path) if _RANK_METADATA.fullmatch(n)]
        self._drop_metadata(*doomed)
        return [
            dataclasses.replace(p, storage_data=_StoragePrefix(f"__{i}_")) if p.storage_data is None else p
            for i, p in enumerate(plans)
        ]

    def _drop_metadata(self, *paths: str) -> None:
        """Removes the metadata files ``paths`` (those present), then makes that durable."""
        gone = False
        for path in paths:
            try:
                os.unlink(path)
                gone = True
            except FileNotFoundError:
                continue
        if gone and self.sync_files:
            _fsync_dir(self.path)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if self.stock:
            return super().write_data(plan, planner)
        prefix = plan.storage_data.prefix
        self.stats = IoStats()
        results = self._write_planned_before(prefix, plan, planner)
        if results is None:
            # Each item's data is resolved as its part is laid out (while the part before it is
            # being written), not all before the first byte is written.
            resolved = ((item, planner.resolve_data(item)) for item in plan.items)
            groups: Any = [resolved] if self.single_file_per_rank else ([x] for x in resolved)
            results = []
            for n, group in enumerate(groups):
                results += self._write_file(f"{prefix}{n}{SUFFIX}", group)
        if self.sync_files:
            _fsync_dir(self.path)  # the new files' names are durable too
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        if self.stock:
            return super().finish(metadata, results)
        metadata.version = _DCP_VERSION
        metadata.storage_meta = self.storage_meta()
        blob = metadata_bytes(metadata, results)  # sets metadata.storage_data
        final = self._own_metadata()
        tmp = final + ".tmp"
        with open(tmp, "wb") as f:
            f.write(blob)
            f.write(trailer(blob))  # its CRC-32, after the pickle (metadata_read.py)
            if self.sync_files:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final)
        if self.sync_files:
            _fsync_dir(self.path)

    def storage_meta(self) -> StorageMeta | None:
        if self.stock:
            return super().storage_meta()
        return StorageMeta(checkpoint_id=os.fspath(self.path), save_id=self.save_id)

    # -- the file --

    def _write_planned_before(self, prefix: str, plan: SavePlan, planner: SavePlanner) -> list[WriteResult] | None:
        """This rank's file written through :meth:`_write_reused` where the planner is hostreg's
        and vouches for the structure (one file per rank); None otherwise (nothing written)."""
        resolve_all = getattr(planner, "resolve_all", None)
        if not self.single_file_per_rank or resolve_all is None:
            return None
        data = resolve_all(plan)
        token = None if data is None else planner.structure_token()
        if token is None:
            return None
        return self._write_reused(f"{prefix}0{SUFFIX}", plan.items, data, token)

    def _write_reused(self, name: str, items: list, data: list, token: str) -> list[WriteResult]:
        """Writes file ``name`` of ``items`` (``data``: each one's) whose structure the planner
        names by ``token``: its tensors from the fixed part laid out at an earlier save of that
        structure (``fixed.py``), where their addresses still fit it, else laid out now (and
        written part by part as it is laid out); the rest laid out now."""
        key = (token, name)
        part = _fixed.find(key, items)
        if part is not None:
            ptrs = part.addresses(data)
            if not part.fits(ptrs) or not part.lock.acquire(blocking=False):
                part = None
        if part is None:
            index = [i for i, (item, d) in enumerate(zip(items, data)) if _fixed.fixable(item, d)]
            sid = f"{int(self.save_id, 16):040d}".encode()
            taken = set(index)
            rest = [(items[i], data[i]) for i in range(len(items)) if i not in taken]

            def new_part(parts: _PartWriter) -> tuple[_fixed.FixedPart, _FileLayout]:
                with collector_paused():  # several objects per item
                    made, last = _fixed.lay_out(
                        name, items, data, index, sid, self._add_tensor, lambda lay: parts.submit(lay, _hostreg.IO_MORE)
                    )
                made.lock.acquire()
                _fixed.keep(key, made)
                return made, last

            return self._write_file(name, rest, laid_out=new_part)
        try:
            part.point(ptrs)
            return self._write_file(name, [(items[i], data[i]) for i in part.rest], first=part)
        finally:
            part.lock.release()

    def _write_file(
        self,
        name: str,
        items: Any,
        first: _fixed.FixedPart | None = None,
        laid_out: Callable[[_PartWriter], tuple[_fixed.FixedPart, _FileLayout]] | None = None,
    ) -> list[WriteResult]:
        """Lays out and writes one file of ``items`` ((WriteItem, data) pairs) in parts, after
        the fixed part ``first`` where one is given, or after the fixed part ``laid_out`` lays
        out now (handing its full parts to the writer; it holds the part's lock, released here)."""
        path = os.path.join(self.path, name)
        fd = _open_to_replace(path, self.direct_io)
        parts = _PartWriter(fd, threads_for(self.path, self.thread_count), self.stats)
        last = _hostreg.IO_SYNC if self.sync_files else 0
        held = None  # the new fixed part's lock: held until its bytes are written
        try:
            results: list[WriteResult] = []
            start = 0
            if laid_out is not None:
                first, last_laid = laid_out(parts)
                held = first
                parts.submit(last_laid, _hostreg.IO_MORE if items else last)
                del last_laid  # it holds this save's tensors; the writer's thread holds it till written
                start = first.end
            elif first is not None:
                parts.submit(first, _hostreg.IO_MORE if items else last)
                start = first.end
            if first is None or items:
                results, lay = self._lay_out(name, items, parts, start)
                parts.submit(lay, last)
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
            if held is not None:
                held.lock.release()
        return results if first is None else Results(first.results, first.token, results)

    def _lay_out(
        self, name: str, items: Any, parts: _PartWriter, start: int = 0
    ) -> tuple[list[WriteResult], _FileLayout]:
        """Every item's container, in file order from offset ``start`` (a multiple of the
        block); full parts go to ``parts`` as they are laid out. Returns the results and the
        last part (not yet written)."""
        lay = _FileLayout(start)
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
                WriteResult(
                    index=item.index,
                    size_in_bytes=lay.pos - start,
                    storage_data=_StorageInfo(name, start, lay.pos - start),
                )
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
