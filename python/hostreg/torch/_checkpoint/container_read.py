"""Reading a ``torch.save`` container of one tensor (``container.py`` writes them): where its
data lies and what it holds, from the container's first and last bytes, without building the
tensor; anything but a dense CPU tensor of a known dtype is refused (None)."""

from __future__ import annotations

import collections
import functools
import io
import pickle
import struct
from dataclasses import dataclass
from typing import Any

import torch

from .._layout import contiguous_strides
from .container import (
    _BIG,
    _CENTRAL,
    _DATA_NAME,
    _DESC,
    _DESC64,
    _DTYPE_OF,
    _END,
    _END64,
    _LOCAL,
    _LOCATOR,
    _records_before_data,
    tensor_pickle,
)


@dataclass
class Stored:
    """Where a container's tensor lies: ``data_offset`` (relative to the container), its dtype,
    shape, and the element offset into its storage record; the tensor is contiguous."""

    data_offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    storage_offset: int


class _MetaUnpickler(pickle.Unpickler):
    """Reads a tensor's ``data.pkl`` without building anything: only the globals torch.save
    writes for a dense CPU tensor are allowed (anything else is refused)."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuilt
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch" and name in _DTYPE_OF:
            return _DTYPE_OF[name]
        raise pickle.UnpicklingError(f"{module}.{name} is not a plain tensor's")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], torch.dtype)):
            raise pickle.UnpicklingError("not a storage record")
        return pid


def _rebuilt(storage: Any, offset: int, size: Any, stride: Any, *rest: Any) -> tuple:
    # _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks,
    # metadata=None): metadata (torch._utils.get_tensor_metadata) carries what the bytes alone
    # do not say, such as a conjugate or negative bit; such a tensor is not a plain one.
    plain = len(rest) < 3 or not rest[2]
    return (storage, offset, tuple(size), tuple(stride), plain)


def parse_tail(tail: bytes | bytearray, length: int) -> dict[str, tuple[int, int]] | None:
    """Records of a container from its last bytes: {name without root: (local header offset,
    size)}, or None when ``tail`` does not reach back to the central directory."""
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + _END.size > len(tail):
        return None
    _, _, _, _, count, cd_size, cd_off, _ = _END.unpack_from(tail, at)
    loc = at - _LOCATOR.size
    if (cd_off == _BIG or cd_size == _BIG or count == 0xFFFF) and loc >= 0 and tail[loc : loc + 4] == b"PK\x06\x07":
        end64 = _LOCATOR.unpack_from(tail, loc)[2] - (length - len(tail))
        if end64 < 0:
            return None
        (_, _, _, _, _, _, _, count, cd_size, cd_off) = _END64.unpack_from(tail, end64)
    pos = cd_off - (length - len(tail))
    if pos < 0:
        return None
    out = {}
    for _ in range(count):
        f = _CENTRAL.unpack_from(tail, pos)
        size, nlen, xlen, clen, off = f[9], f[10], f[11], f[12], f[16]
        name = bytes(tail[pos + 46 : pos + 46 + nlen]).decode()
        x = pos + 46 + nlen
        extra_end = x + xlen
        while x + 4 <= extra_end:
            xid, xl = struct.unpack_from("<HH", tail, x)
            if xid == 1:
                vals = list(struct.unpack_from(f"<{xl // 8}Q", tail, x + 4))
                if size == _BIG:
                    size = vals.pop(0)
                    vals.pop(0)  # compressed size: the same for stored records
                if off == _BIG and vals:
                    off = vals.pop(0)
            x += 4 + xl
        out[name.split("/", 1)[1] if "/" in name else name] = (off, size)
        pos += 46 + nlen + xlen + clen
    return out


def local_data_offset(head: bytes | bytearray, at: int) -> int | None:
    """Offset of the data of the record whose local header starts at ``at`` of ``head``."""
    if at + _LOCAL.size > len(head) or head[at : at + 4] != b"PK\x03\x04":
        return None
    f = _LOCAL.unpack_from(head, at)
    return at + _LOCAL.size + f[9] + f[10]


@functools.lru_cache(maxsize=1024)
def _decode(pkl: bytes) -> Any:
    """A ``data.pkl``'s (storage, offset, shape, stride, plain) or None (cached: the tensors of
    one dtype and shape share one pickle)."""
    try:
        return _MetaUnpickler(io.BytesIO(pkl)).load()
    except Exception:
        return None


class Pattern:
    """What :func:`data_offset` compares a container with for a contiguous tensor of one dtype
    and shape: the records before its data record (``before``), and its size in bytes."""

    __slots__ = ("before", "nbytes", "desc", "big")

    def __init__(self, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
        self.before = _records_before_data(tensor_pickle(dtype, tuple(shape)))[0]
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        self.nbytes = nbytes
        self.big = nbytes >= _BIG
        self.desc = _DESC64 if self.big else _DESC


_patterns: dict[tuple, Pattern | None] = {}


def pattern(dtype: torch.dtype, shape: tuple[int, ...]) -> Pattern | None:
    """The :class:`Pattern` of a contiguous ``dtype`` tensor of ``shape`` (cached), or None for
    a dtype hostreg's writer does not encode itself."""
    key = (dtype, shape)
    got = _patterns.get(key, False)
    if got is False:
        got = Pattern(dtype, shape) if dtype in _DTYPE_OF.values() else None
        if len(_patterns) >= 4096:
            _patterns.clear()
        _patterns[key] = got
    return got  # type: ignore[return-value]


_LOCAL_SIG = 0x04034B50
_DESC_SIG = 0x08074B50
_DATA_NAME_LEN = len(_DATA_NAME)


def data_offset(buf: Any, at: int, length: int, pat: Pattern) -> int:
    """Where the data of the container at ``buf[at:at + length]`` (all of it read; ``buf`` a
    bytearray or an ``mmap``, whose ``find`` bounded by both ends is a comparison) starts,
    relative to ``at``, when it is laid out as hostreg's writer lays out a tensor of ``pat``'s
    dtype and shape (``container.py``): its records before the data byte for byte, then a
    stored (uncompressed) data record named ``data/0``, then after ``pat.nbytes`` of data the
    descriptor with that size; else -1 (then :func:`parse` it). Byte comparisons instead of a
    parse: about a microsecond a container."""
    lh = at + len(pat.before)
    end = at + length
    if lh + _LOCAL.size > end or buf.find(pat.before, at, lh) != at:
        return -1
    f = _LOCAL.unpack_from(buf, lh)
    name_at = lh + _LOCAL.size
    if (
        f[0] != _LOCAL_SIG
        or f[4] != 0
        or f[9] != _DATA_NAME_LEN
        or buf.find(_DATA_NAME, name_at, name_at + f[9]) != name_at
    ):
        return -1
    data = name_at + f[9] + f[10]
    desc = data + pat.nbytes
    if desc + pat.desc.size > end:
        return -1
    d = pat.desc.unpack_from(buf, desc)
    if d[0] != _DESC_SIG or d[2] != pat.nbytes or d[3] != pat.nbytes:
        return -1
    return data - at


def written_by_hostreg(
    buf: bytearray, at: int, length: int, dtype: torch.dtype, shape: tuple[int, ...]
) -> Stored | None:
    """The tensor of the container at ``buf[at:at + length]`` (all of it read) when
    :func:`data_offset` finds it laid out as hostreg's writer lays out a contiguous ``dtype``
    tensor of ``shape``; else None (then :func:`parse` it)."""
    pat = pattern(dtype, tuple(shape))
    if pat is None:
        return None
    data = data_offset(buf, at, length, pat)
    return None if data < 0 else Stored(data, dtype, tuple(shape), 0)


def parse(head: bytes | bytearray, tail: bytes | bytearray, length: int) -> Stored | None:
    """The tensor of a container from its first and last bytes (``length`` in all), or None
    when they do not suffice, are damaged, or it is not a plain contiguous tensor whose
    storage lies within the container (then torch.load it)."""
    try:
        return _parse(head, tail, length)
    except (struct.error, UnicodeDecodeError, ValueError, IndexError):
        return None  # damaged: DCP's reader (torch.load) says what it makes of it


def _parse(head: bytes | bytearray, tail: bytes | bytearray, length: int) -> Stored | None:
    records = parse_tail(tail, length)
    if (
        records is None
        or "data.pkl" not in records
        or "data/0" not in records
        or len([n for n in records if n.startswith("data/")]) != 1
    ):
        return None
    pkl_off, pkl_size = records["data.pkl"]
    start = local_data_offset(head, pkl_off)
    data_lh = records["data/0"][0]
    data = local_data_offset(head, data_lh)
    if start is None or data is None or start + pkl_size > len(head):
        return None
    got = _decode(bytes(head[start : start + pkl_size]))
    if not (isinstance(got, tuple) and len(got) == 5 and isinstance(got[0], tuple) and got[4]):
        return None  # not a plain tensor (its metadata, e.g. a conjugate bit, says more): torch.load it
    (_, dtype, _, _, numel), offset, shape, stride, _ = got
    count = 1
    for n in shape:
        count *= n
    if stride != contiguous_strides(shape) and count > 1:
        return None
    if offset + count > numel or numel * dtype.itemsize > records["data/0"][1]:
        return None
    if data + numel * dtype.itemsize > length or offset < 0:
        return None  # the storage does not lie within the container: not one DCP wrote
    return Stored(data, dtype, shape, offset)
