"""DCP's ``TORCH_SAVE`` encoding of one tensor, written and read by hand (docs/checkpoint.md).

A stock DCP checkpoint stores each tensor as a ``torch.save`` container (a ZIP archive of
stored, uncompressed records) at an offset of its rank's file. hostreg's writer produces the
same container, record for record, with two freedoms the format allows: the tensor's data
record starts where the writer wants it (the local header's extra field pads it, as
``torch.save`` itself pads records to ``.storage_alignment``), and its CRC-32 is filled in by
the C core while the bytes go to disk. The small records (``.format_version``, ``byteorder``,
``version``, ...) are taken from the installed torch's own ``torch.save`` output, so a
container always says what that torch would say. ``torch.load`` (and so DCP's stock
``FileSystemReader`` and ``format_utils.dcp_to_torch_save``) reads it as any other.

ZIP facts (PKWARE APPNOTE 6.3.x, sections 4.3.7-4.3.16, 4.5.3): local header 30 bytes +
name + extra, then data; flag bit 3 puts CRC and sizes in a data descriptor after the data
(``torch.save``'s writer, miniz, sets bits 3 and 11 and zeroes them in the local header);
central directory headers of 46 bytes + name + extra; a ZIP64 end record, its locator, and
the end record; sizes or offsets of 0xFFFFFFFF or more live in ZIP64 extra fields (id 1).
"""

from __future__ import annotations

import collections
import functools
import io
import pickle
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import torch

from .._layout import contiguous_strides

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header
_DESC = struct.Struct("<IIII")  # data descriptor: signature, crc, compressed and real size
_DESC64 = struct.Struct("<IIQQ")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory header
_END64 = struct.Struct("<IQHHIIQQQQ")  # ZIP64 end of central directory record
_LOCATOR = struct.Struct("<IIQI")  # ZIP64 end of central directory locator
_END = struct.Struct("<IHHHHIIH")  # end of central directory record
_FLAGS = 0x0808  # bit 3: data descriptor; bit 11: UTF-8 names (as torch.save writes)
_PAD_ID = 0x4246  # "FB": the extra field torch.save pads records with
_BIG = 0xFFFFFFFF

ROOT = "archive"  # the folder torch.save names records under when writing to a stream


def _storage_names() -> dict[torch.dtype, str]:
    """dtype -> torch's legacy storage class name, as torch.save pickles it (quantized dtypes,
    whose tensors pickle otherwise, left out)."""
    from torch.storage import _dtype_to_storage_type_map

    quantized = {torch.qint8, torch.qint32, torch.quint8, torch.quint4x2, torch.quint2x4}
    return {d: n for d, n in _dtype_to_storage_type_map().items() if d not in quantized}


_STORAGE_NAME = _storage_names()
_DTYPE_OF = {n: d for d, n in _STORAGE_NAME.items()}


def encodable(t: torch.Tensor) -> bool:
    """Can :func:`tensor_pickle` describe ``t`` as ``torch.save`` would? (Dense, strided, a dtype
    with a legacy storage class; others go through ``torch.save`` itself.)"""
    return t.layout == torch.strided and not t.is_quantized and t.dtype in _STORAGE_NAME


class _Storage:
    """Stands for the data record in the pickle (a persistent id, as torch.save writes it)."""

    __slots__ = ("pid",)

    def __init__(self, dtype: torch.dtype, numel: int) -> None:
        self.pid = ("storage", getattr(torch, _STORAGE_NAME[dtype]), "0", "cpu", numel)


class _Tensor:
    """Pickles as torch pickles a CPU tensor (``Tensor.__reduce_ex__``: ``_rebuild_tensor_v2``)."""

    __slots__ = ("args",)

    def __init__(self, args: tuple) -> None:
        self.args = args

    def __reduce__(self) -> tuple:
        return (torch._utils._rebuild_tensor_v2, self.args)


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return obj.pid if type(obj) is _Storage else None


_pickles: dict[tuple, bytes] = {}


def tensor_pickle(dtype: torch.dtype, shape: tuple[int, ...]) -> bytes:
    """``data.pkl`` of a contiguous tensor of ``dtype`` and ``shape`` whose storage is record
    ``0``, byte for byte what ``torch.save`` writes for such a tensor (cached per signature)."""
    key = (dtype, shape)
    got = _pickles.get(key)
    if got is None:
        numel = 1
        for n in shape:
            numel *= n
        buf = io.BytesIO()
        args: tuple = (
            _Storage(dtype, numel),
            0,
            tuple(shape),
            contiguous_strides(shape),
            False,
            collections.OrderedDict(),
        )
        _Pickler(buf, protocol=2).dump(_Tensor(args))
        got = _pickles[key] = buf.getvalue()
    return got


def _records_of(raw: bytes) -> list[tuple[str, bytes]]:
    """(name without the root folder, payload) of every record of a small torch.save output."""
    import zipfile

    with zipfile.ZipFile(io.BytesIO(raw)) as z:
        return [(i.filename.split("/", 1)[1], z.read(i)) for i in z.infolist()]


def _torch_records() -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]], int]:
    """The installed torch's small records before and after the data record, and its storage
    alignment (64 in torch 2.13, ``.storage_alignment``; 64 before it was written down)."""
    buf = io.BytesIO()
    torch.save(torch.zeros(1), buf)
    before: list[tuple[str, bytes]] = []
    after: list[tuple[str, bytes]] = []
    seen = False
    for name, payload in _records_of(buf.getvalue()):
        if name == "data/0":
            seen = True
        elif name == "data.pkl":
            continue
        elif name == ".data/serialization_id":
            after.append((name, b""))  # this save's own, filled per container
        else:
            (after if seen else before).append((name, payload))
    align = int(dict(before + after).get(".storage_alignment", b"64"))
    return before, after, align


_BEFORE, _AFTER, STORAGE_ALIGNMENT = _torch_records()


@dataclass
class Container:
    """One tensor's container around its data: ``head`` (bytes before the data) and ``tail``
    (after it), with where the data's CRC-32 goes in ``tail`` (zeros there until the writer
    fills it in). The data follows ``head`` directly."""

    head: bytes
    tail: bytes
    crc_at: tuple[int, int]  # offsets in tail of the data's CRC-32 (descriptor, central header)


def _name(n: str) -> bytes:
    return f"{ROOT}/{n}".encode()


_DATA_NAME = _name("data/0")


def _local(name: bytes, payload: bytes, crc: int) -> bytes:
    """A whole stored record: local header, name, payload, data descriptor."""
    return (
        _LOCAL.pack(0x04034B50, 0, _FLAGS, 0, 0, 0, 0, 0, 0, len(name), 0)
        + name
        + payload
        + _DESC.pack(0x08074B50, crc, len(payload), len(payload))
    )


@functools.lru_cache(maxsize=1024)
def _records_before_data(pkl: bytes) -> tuple[bytes, tuple[tuple[bytes, int, int, int], ...]]:
    """The records before the data record (data.pkl, then torch's small ones) and their
    central directory entries (name, offset, crc, size); the same for every tensor of one
    signature."""
    head = bytearray()
    central = []
    for name, payload in [("data.pkl", pkl), *_BEFORE]:
        n, crc = _name(name), zlib.crc32(payload)
        central.append((n, len(head), crc, len(payload)))
        head.extend(_local(n, payload, crc))
    return bytes(head), tuple(central)


@functools.lru_cache(maxsize=4096)
def _container(pkl: bytes, data_len: int, pad: int, serialization_id: bytes) -> tuple[bytes, bytes, tuple[int, int]]:
    """(head, tail, CRC offsets in tail) of a container whose data record's local header has
    ``pad`` bytes of extra field; its offsets are relative to the container's start, so the
    same bytes serve every tensor of this signature and padding, wherever it lies."""
    before, central_before = _records_before_data(pkl)
    head = bytearray(before)
    central = list(central_before)  # (name, offset, crc, size)
    lh = len(head)
    head.extend(_LOCAL.pack(0x04034B50, 0, _FLAGS, 0, 0, 0, 0, 0, 0, len(_DATA_NAME), pad))
    head.extend(_DATA_NAME)
    if pad:
        head.extend(struct.pack("<HH", _PAD_ID, pad - 4))
        head.extend(b"Z" * (pad - 4))
    big = data_len >= _BIG
    tail = bytearray()
    crc_desc = len(tail) + 4
    tail.extend(
        _DESC64.pack(0x08074B50, 0, data_len, data_len) if big else _DESC.pack(0x08074B50, 0, data_len, data_len)
    )
    data_central = len(central)
    central.append((_DATA_NAME, lh, 0, data_len))
    rel = len(head) + data_len + len(tail)  # offsets below are relative to the container
    for name, payload in _AFTER:
        if name == ".data/serialization_id":
            payload = serialization_id
        nm = _name(name)
        crc = zlib.crc32(payload)
        central.append((nm, rel, crc, len(payload)))
        piece = _local(nm, payload, crc)
        tail.extend(piece)
        rel += len(piece)
    cd_start, crc_central = rel, 0
    for i, (nm, off, crc, size) in enumerate(central):
        extra = b""
        fields = []
        if size >= _BIG:
            fields += [size, size]
        if off >= _BIG:
            fields.append(off)
        if fields:
            extra = struct.pack("<HH", 1, 8 * len(fields)) + struct.pack(f"<{len(fields)}Q", *fields)
        if i == data_central:
            crc_central = len(tail) + 16
        s32 = _BIG if size >= _BIG else size
        tail.extend(
            _CENTRAL.pack(
                0x02014B50,
                0,
                0,
                _FLAGS,
                0,
                0,
                0,
                crc,
                s32,
                s32,
                len(nm),
                len(extra),
                0,
                0,
                0,
                0,
                _BIG if off >= _BIG else off,
            )
        )
        tail.extend(nm)
        tail.extend(extra)
    cd_size = len(head) + data_len + len(tail) - cd_start
    end64 = len(head) + data_len + len(tail)
    count = len(central)
    tail.extend(_END64.pack(0x06064B50, 44, 0x031E, 45, 0, 0, count, count, cd_size, cd_start))
    tail.extend(_LOCATOR.pack(0x07064B50, 0, end64, 1))
    tail.extend(_END.pack(0x06054B50, 0, 0, count, count, min(cd_size, _BIG), min(cd_start, _BIG), 0))
    return bytes(head), bytes(tail), (crc_desc, crc_central)


def layout(pkl: bytes, data_len: int, start: int, data_at: Any, serialization_id: bytes) -> Container:
    """The container of one tensor whose pickle is ``pkl`` and whose data is ``data_len`` bytes,
    starting at file offset ``start``; ``data_at(first_possible)`` gives the file offset for the
    data (>= its argument, ``first_possible`` + 0 or + 4 or more, as the padding field needs).
    Raises ValueError for a ``data_at`` that answers 1-3 bytes on (no extra field is that short)."""
    first = start + len(_records_before_data(pkl)[0]) + _LOCAL.size + len(_DATA_NAME)
    at = data_at(first)
    pad = at - first
    if pad < 0 or 0 < pad < 4 or pad > 0xFFFF:
        raise ValueError(f"the data cannot start {pad} bytes after the local header's end (0 or 4-65,535)")
    return Container(*_container(pkl, data_len, pad, serialization_id))
