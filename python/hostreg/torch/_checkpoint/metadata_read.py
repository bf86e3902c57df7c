"""``.metadata`` read as data, not as a program (docs/checkpoint.md, "Reading untrusted
checkpoints").

DCP's ``.metadata`` is a pickle, and ``pickle.load`` of a file from elsewhere runs whatever the
file names: a checkpoint from someone else is code. hostreg's reader unpickles it with
:class:`MetadataUnpickler`, which builds only the types a DCP checkpoint's metadata is made of
(DCP's own dataclasses in ``torch.distributed.checkpoint.metadata`` and ``filesystem``, and the
torch values they hold: ``torch.Size``, dtypes, layouts, memory formats) and the plain values
pickle makes itself (dicts, lists, tuples, strings, numbers). Anything else is refused with
:class:`UntrustedMetadataError`, before it is built; ``trusted=True`` on the reader unpickles
as DCP does, for checkpoints whose origin the user vouches for.

Then :func:`check_storage` holds every entry of ``storage_data`` to what the reader can read
safely: a file name inside the checkpoint's directory, offsets and lengths that are
non-negative integers; and :func:`check_ranges` each file's items to the file's size, without
overlaps.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import io
import os
import pickle
import stat
import struct
import zlib
from collections.abc import Callable
from typing import Any

import torch

from ... import _hostreg

# (module, name) of every class or function a DCP metadata pickle names, in torch 2.4 to 2.13
# (the dataclasses of torch/distributed/checkpoint/metadata.py and filesystem.py, and the
# reducers torch's own types pickle with).
_ALLOWED = {
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "TensorProperties"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    # Older checkpoints' TensorProperties (torch/distributed/_shard/sharded_tensor/metadata.py,
    # which DCP's metadata.py took it from; PyTorch's test_compatibility.py loads them still).
    ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),
    ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("collections", "OrderedDict"),
    # StorageMeta.checkpoint_id: DCP's writers keep the path they were given, str or Path.
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
}


class UntrustedMetadataError(pickle.UnpicklingError):
    """A checkpoint's ``.metadata`` names a type that DCP's metadata is not made of (it could
    run code when unpickled), or is not a pickle of DCP's metadata at all."""


class MetadataUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that builds only DCP metadata's own types (see the module
    docstring); anything else raises :class:`UntrustedMetadataError` naming it."""

    def __init__(self, file: Any, source: str) -> None:
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return self._member  # an enum member by name, as some Pythons pickle them
        if module == "torch" and isinstance(vars(torch).get(name), torch.dtype):  # no import, no property run
            return vars(torch)[name]
        raise UntrustedMetadataError(
            f"{self.source} names {module}.{name}, which DCP's metadata is not made of: not loaded, "
            "since unpickling it could run code. Pass trusted=True to hostreg.torch.FileSystemReader "
            "only for a checkpoint whose origin you trust."
        )

    def _member(self, cls: Any, name: Any) -> Any:
        """``getattr(cls, name)`` where ``cls`` is an enum class of the allow-list (itself
        found through :meth:`find_class`) and ``name`` one of its members (Python 3.11.2
        pickles ``_MEM_FORMAT_ENCODING`` members so); anything else is refused."""
        if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(name, str) and name in cls.__members__:
            return cls[name]
        raise UntrustedMetadataError(f"{self.source} asks for attribute {name!r} of {cls!r}: not an enum member")

    def persistent_load(self, pid: Any) -> Any:
        raise UntrustedMetadataError(f"{self.source} holds a persistent id, which DCP's metadata has none of")


# hostreg's writer ends .metadata with this trailer after the pickle: magic, the pickle's
# CRC-32 and length, magic. pickle.load stops at the pickle's STOP opcode and leaves what
# follows unread (Python's pickle documentation: "bytes past the pickled representation of
# the object are ignored"), so DCP's reader reads the file as before.
_TRAILER = struct.Struct("<4sIQ4s")
_MAGIC = b"HRMD"


def crc32(data: bytes, n: int | None = None) -> int:
    """zlib's CRC-32 of the first ``n`` bytes of ``data`` (all: None), by the C core
    (libdeflate: a few ms for a 65,536-tensor .metadata, where zlib.crc32 takes about 12 ms),
    without copying them."""
    n = len(data) if n is None else n
    if n < 1 << 16:
        return zlib.crc32(memoryview(data)[:n])
    address = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0  # data's own bytes, not a copy
    code, got = _hostreg.crc32_batch([address], [n], 0)
    if code != 0:
        raise MemoryError("no memory to checksum .metadata")
    return got[0]


def trailer(blob: bytes) -> bytes:
    """The trailer that follows ``blob`` (a pickle) in the file."""
    return _TRAILER.pack(_MAGIC, crc32(blob), len(blob), _MAGIC)


def split_trailer(raw: bytes) -> tuple[int, bool | None]:
    """(the pickle's length, whether its CRC-32 is the trailer's: True, False, or None where
    ``raw`` has no trailer: not written by hostreg)."""
    if len(raw) < _TRAILER.size:
        return len(raw), None
    magic, crc, n, end = _TRAILER.unpack_from(raw, len(raw) - _TRAILER.size)
    if magic != _MAGIC or end != _MAGIC or n != len(raw) - _TRAILER.size:
        return len(raw), None
    return n, crc32(raw, n) == crc


def _guarded() -> list[Any]:
    """The objects of the allow-list whose attributes a pickle's BUILD could set (Python
    classes and functions, and the enum's members; torch.Size and OrderedDict are C types)."""
    import importlib

    out: list[Any] = []
    for module, name in _ALLOWED:
        obj = getattr(importlib.import_module(module), name)
        if hasattr(obj, "__dict__"):
            out.append(obj)
        if isinstance(obj, type) and issubclass(obj, enum.Enum):
            out += list(obj)
    return out


@contextlib.contextmanager
def _unchanged(source: str) -> Any:
    """Unpickling inside: a BUILD aimed at a class or function of the allow-list itself (not
    at an instance) would set its attributes, for the whole process. Each is compared with
    its attributes before, put back as it was, and the load refused."""
    guarded = _guarded()
    before = [dict(vars(obj)) for obj in guarded]
    try:
        yield
    finally:
        changed = []
        for obj, was in zip(guarded, before):
            now = vars(obj)
            if now.keys() == was.keys() and all(now[k] is v for k, v in was.items()):
                continue
            changed.append(obj)
            for k in [k for k in now if k not in was]:
                delattr(obj, k)
            for k, v in was.items():
                if k not in now or now[k] is not v:
                    setattr(obj, k, v)
        if changed:
            raise UntrustedMetadataError(f"{source} sets attributes of {changed[0]!r}, not of an instance: refused")


def load_metadata(path: str, trusted: bool) -> Any:
    """The ``Metadata`` pickled in file ``path``: with :class:`MetadataUnpickler`, or plain
    ``pickle`` when ``trusted``. ``FileNotFoundError`` when it is missing (DCP's load then
    looks for a rank's own), :class:`UntrustedMetadataError` when it is empty, truncated, not
    a pickle, not a ``Metadata``, or names another type, or where hostreg wrote it (a
    trailer after the pickle, :func:`trailer`) and its CRC-32 differs."""
    from torch.distributed.checkpoint.metadata import Metadata

    with open(path, "rb") as f:
        raw = f.read()
    n, intact = split_trailer(raw)
    if intact is False:
        raise UntrustedMetadataError(f"{path} is damaged: its bytes do not have the CRC-32 its writer gave them")
    if intact:  # written by hostreg: its index, where it has one, stands for the pickle (index.py)
        from . import index as _index

        view = _index.find(raw, n)
        if view is not None:
            try:
                return _index.Index(view, path).metadata()
            except (_index.BadIndex, UntrustedMetadataError, pickle.UnpicklingError, EOFError, UnicodeDecodeError):
                pass  # unpickled whole below, as any other
    stream = io.BytesIO(raw)
    try:
        if trusted:
            got = pickle.Unpickler(stream).load()
        else:
            with _unchanged(path):
                got = MetadataUnpickler(stream, path).load()
    except UntrustedMetadataError:
        raise
    except Exception as e:  # EOFError, UnpicklingError, and whatever a damaged pickle raises
        what = "empty" if not raw else f"not a whole pickle ({type(e).__name__}: {e})"
        raise UntrustedMetadataError(f"{path} is {what}: not a DCP checkpoint's metadata") from e
    if stream.tell() != n:  # bytes after the pickle, and not a whole trailer of hostreg's
        raise UntrustedMetadataError(f"{path} is damaged: {n - stream.tell():,} bytes follow its pickle")
    if not isinstance(got, Metadata):
        raise UntrustedMetadataError(f"{path} holds a {type(got).__name__}, not DCP's Metadata")
    return got


def check_storage(metadata: Any, directory: str) -> None:
    """Raises ``ValueError`` naming the item where an entry of ``metadata.storage_data`` could
    make the reader read outside the checkpoint: a file name that is not one plain name in
    ``directory`` (a separator, ``..``, an absolute path, a symbolic link), or an offset or a
    length that is not a non-negative integer. (Offsets past a file's end are found when the
    file is read: an ``OSError``.)"""
    storage = getattr(metadata, "storage_data", None)
    from .index import Storage

    if isinstance(storage, Storage):  # from an index: offsets checked as it was read; its files here
        for name in set(storage.index.files):
            if not _file_of(directory, name):
                raise ValueError(f"the index of {directory} names file {name!r}, which is not a file of it")
        return
    if not isinstance(storage, dict):
        raise ValueError(f"the metadata of {directory} has no storage_data mapping")
    names: dict[str, bool] = {}
    for index, info in storage.items():
        rel, off, length = (getattr(info, k, None) for k in ("relative_path", "offset", "length"))
        ok = names.get(rel) if isinstance(rel, str) else False
        if ok is None and isinstance(rel, str):
            ok = names[rel] = _file_of(directory, rel)
        if not ok:
            raise ValueError(f"{getattr(index, 'fqn', index)}: its file {rel!r} is not a file of {directory}")
        if type(off) is not int or type(length) is not int or off < 0 or length < 0 or off + length >= 1 << 63:
            raise ValueError(  # (a file holds fewer than 2**63 bytes: off_t is int64)
                f"{getattr(index, 'fqn', index)}: offset {off!r} and length {length!r} are not byte counts"
            )


def _file_of(directory: str, name: str) -> bool:
    """Is ``name`` one plain name in ``directory`` (no separator, not ``.`` or ``..``, no NUL)
    whose file, if it exists, is a regular file (:func:`_plain`)?"""
    return name not in ("", ".", "..") and os.sep not in name and "\0" not in name and _plain(directory, name)


def _plain(directory: str, name: str) -> bool:
    """Is ``name`` in ``directory`` a regular file (not a symbolic link, a FIFO, a device), or
    missing (an error when it is opened, naming it)?"""
    try:
        return stat.S_ISREG(os.lstat(os.path.join(directory, name)).st_mode)
    except FileNotFoundError:
        return True
    except OSError:
        return False


def check_bytes_item(key: str, raw: bytes) -> None:
    """Raises :class:`UntrustedMetadataError` naming the item where the bytes item ``raw``
    (``torch.save`` of a value) holds anything ``torch.load(weights_only=True)`` refuses: DCP's
    planners load bytes items with ``weights_only=False``, which runs what the pickle names.
    What it admits (numbers, strings, lists, dicts, tensors, ``io.BytesIO``, ...) names only
    functions that build those, so the planner's own load of the same bytes runs nothing else."""
    allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5; DCP saves BytesIO values so
    try:
        with allow([io.BytesIO]) if allow is not None else contextlib.nullcontext():
            torch.load(io.BytesIO(raw), weights_only=True)
    except Exception as e:
        raise UntrustedMetadataError(
            f"{key}: its bytes item holds what torch.load(weights_only=True) refuses ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}): not loaded, since unpickling it could run code. Pass "
            "trusted=True to hostreg.torch.FileSystemReader only for a checkpoint whose origin you trust."
        ) from e


def check_ranges(name: str, size: int, reqs: Any, infos: list[Any]) -> None:
    """Raises ``ValueError`` naming the item where the items ``reqs`` of file ``name`` (``size``
    bytes; ``infos``: each one's ``_StorageInfo``) run past its end (a truncated file, or
    metadata of another) or overlap one another (no writer lays items out so)."""
    offs, lens, labels = spans_of(reqs, infos)
    check_spans(
        name, size, torch.tensor(offs, dtype=torch.int64), torch.tensor(lens, dtype=torch.int64), labels.__getitem__
    )


def spans_of(reqs: Any, infos: list[Any]) -> tuple[list[int], list[int], list[str]]:
    """The distinct containers ``infos`` of read items ``reqs`` (several items may read one):
    (their offsets, lengths, and the name of the first item of each)."""
    seen: dict[int, int] = {}
    for k, info in enumerate(infos):
        seen.setdefault(id(info), k)
    ks = list(seen.values())
    return [infos[k].offset for k in ks], [infos[k].length for k in ks], [reqs[k].storage_index.fqn for k in ks]


def check_spans(name: str, size: int, offs: torch.Tensor, lens: torch.Tensor, label: Callable[[int], str]) -> None:
    """:func:`check_ranges` over distinct containers given as tensors (int64 byte offsets and
    lengths in file ``name`` of ``size`` bytes); ``label(j)`` names the item of the j-th in
    an error."""

    def what(j: int) -> str:
        o, n = int(offs[j]), int(lens[j])
        return f"{label(j)}: bytes {o} to {o + n} of {name}"

    stops = offs + lens
    past = (stops > size).nonzero().squeeze(1)
    if len(past):
        j = int(past[offs[past].argmin()])
        raise ValueError(f"{what(j)} run past the end of {name} ({size} bytes): truncated, or not this file's metadata")
    if len(offs) < 2:
        return
    order = torch.argsort(offs, stable=True)
    starts, ends = offs[order], torch.cummax(stops[order], 0).values
    bad = (starts[1:] < ends[:-1]).nonzero()
    if len(bad):
        j = int(bad[0]) + 1
        raise ValueError(f"{what(int(order[j]))} overlap another item's (at most up to byte {int(ends[j - 1])})")
