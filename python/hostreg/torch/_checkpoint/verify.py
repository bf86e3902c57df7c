"""Verification of a checkpoint's files against what was saved (docs/checkpoint.md,
"Verifying a checkpoint"): every byte of every container, and of ``.metadata`` where hostreg
wrote it.

A DCP container is a ZIP archive of stored records (``container.py``), and ZIP carries a
CRC-32 of every record's bytes (PKWARE APPNOTE 6.3.x, 4.4.7). :func:`check_container` holds a
container to that: the end records, ZIP64 records and central directory tile the container's
end exactly and agree with one another; each central entry's local header says the same
(version, flags, method, time, date, name; sizes and CRC in the data descriptor after the
data, as ``torch.save`` writes them); the records tile the container from its first byte; a
padding extra field holds only ``Z``; the fields that ZIP keeps once per entry (version made
by, attributes) are the same in every entry. So a changed byte anywhere is either in a
record's bytes (then its CRC-32 differs) or in a structure that no longer agrees with its
other copy. The CRC-32s are computed by the C core (``hostregCrc32Batch``: libdeflate).
Bytes of a file outside every container must be zero (hostreg's writer pads with zeros; DCP's
leaves none). Works for DCP's own checkpoints as for hostreg's.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Any

from ... import _hostreg
from .._collector import collector_paused
from .container import _CENTRAL, _DESC, _DESC64, _END, _END64, _LOCAL, _LOCATOR, _PAD_ID

_BIG = 0xFFFFFFFF
# The ZIP64 end record's size of record, version made by and version needed, which ZIP keeps
# once: the values torch.save's writer (miniz) gives every archive, as container.py does.
_END64_VERSIONS = (44, 0x031E, 45)


class CorruptCheckpointError(ValueError):
    """A checkpoint's bytes are not what was saved: names the file, the tensor (the item's
    key) and the byte offset in the file where it differs."""


@dataclass
class Problem:
    """One place where a checkpoint differs from what was saved."""

    file: str
    item: str  # the item's key, or "" for bytes outside every item
    offset: int  # byte offset in the file
    what: str

    def __str__(self) -> str:
        where = f"{self.item} (in {self.file})" if self.item else self.file
        return f"{where}, byte {self.offset:,}: {self.what}"


class _Bad(Exception):
    def __init__(self, offset: int, what: str) -> None:
        super().__init__(what)
        self.offset, self.what = offset, what


def _u(st: struct.Struct, buf: Any, at: int, end: int, what: str) -> tuple:
    if at < 0 or at + st.size > end:
        raise _Bad(max(at, 0), f"{what} runs past the container")
    return st.unpack_from(buf, at)


def check_container(buf: Any, at: int, length: int) -> list[tuple[int, int, int, str]]:
    """Checks the structure of the container at ``buf[at:at + length]``; returns its records'
    bytes to checksum: (start in ``buf``, length, the CRC-32 the container gives, name).
    Raises ``_Bad`` (an offset relative to ``at``, and what) where it is not a whole ZIP
    archive of stored records as DCP writes them."""
    end = at + length
    e = _u(_END, buf, end - _END.size, end, "the end record")
    if e[0] != 0x06054B50 or e[1] or e[2] or e[3] != e[4] or e[7]:
        raise _Bad(length - _END.size, "the ZIP end record is damaged")
    count, cd_size, cd_off, cd_end = e[3], e[5], e[6], end - _END.size
    loc_at = cd_end - _LOCATOR.size
    zip64 = loc_at >= at and buf.find(b"PK\x06\x07", loc_at, loc_at + 4) == loc_at  # torch.save writes one always
    if zip64 or count == 0xFFFF or cd_size == _BIG or cd_off == _BIG:
        loc = _u(_LOCATOR, buf, loc_at, end, "the ZIP64 locator")
        if loc[0] != 0x07064B50 or loc[1] or loc[3] != 1:
            raise _Bad(loc_at - at, "the ZIP64 locator is damaged")
        e64_at = at + loc[2]
        e64 = _u(_END64, buf, e64_at, end, "the ZIP64 end record")
        if (
            e64[0] != 0x06064B50
            or e64[1:4] != _END64_VERSIONS
            or e64[4]
            or e64[5]
            or e64[6] != e64[7]
            or e64_at + 56 != loc_at
        ):
            raise _Bad(e64_at - at, "the ZIP64 end record is damaged")
        if (count != 0xFFFF and count != e64[6]) or (cd_size != _BIG and cd_size != e64[8]):
            raise _Bad(length - _END.size, "the ZIP end records disagree")
        if cd_off != _BIG and cd_off != e64[9]:
            raise _Bad(length - _END.size, "the ZIP end records disagree")
        count, cd_size, cd_off, cd_end = e64[6], e64[8], e64[9], e64_at
    if cd_off + cd_size != cd_end - at:
        raise _Bad(length - _END.size, "the central directory does not end where the end records begin")
    entries = []
    pos = at + cd_off
    for _ in range(count):
        f = _u(_CENTRAL, buf, pos, cd_end, "a central directory entry")
        if f[0] != 0x02014B50:
            raise _Bad(pos - at, "a central directory entry is damaged")
        nlen, xlen, clen = f[10], f[11], f[12]
        name = bytes(buf[pos + 46 : pos + 46 + nlen])
        size, off = f[9], f[16]
        x, xend = pos + 46 + nlen, pos + 46 + nlen + xlen
        while x < xend:
            xid, xl = _u(struct.Struct("<HH"), buf, x, xend, "an extra field")
            if xid != 1 or x + 4 + xl > xend or xl % 8:
                raise _Bad(x - at, "a central directory entry's extra field is damaged")
            vals = list(struct.unpack_from(f"<{xl // 8}Q", buf, x + 4))
            if f[9] == _BIG:
                if len(vals) < 2 or vals[0] != vals[1]:
                    raise _Bad(x - at, "a ZIP64 size is damaged")
                size = vals.pop(0)
                vals.pop(0)
            if f[16] == _BIG:
                if not vals:
                    raise _Bad(x - at, "a ZIP64 offset is missing")
                off = vals.pop(0)
            if vals:
                raise _Bad(x - at, "a ZIP64 extra field holds more than it should")
            x += 4 + xl
        if clen or f[8] != f[9] or f[4] != 0:
            raise _Bad(pos - at, f"the central entry of {name.decode(errors='replace')} is damaged")
        entries.append((pos, f, name, size, off))
        pos = xend + clen
    if pos != cd_end:
        raise _Bad(cd_off, "the central directory's entries do not fill it")
    same = [(f[1], f[13], f[14], f[15]) for _, f, _, _, _ in entries]  # made by, disk, attributes
    for (p, _, _, _, _), s in zip(entries, same):
        if s != max(set(same), key=same.count):
            raise _Bad(p - at, "a central directory entry differs from the others")
    out = []
    next_at = 0
    for _, f, name, size, off in sorted(entries, key=lambda x: x[4]):
        label = name.decode(errors="replace")
        if off != next_at:
            raise _Bad(off, f"record {label} does not start where the one before it ends")
        lh = _u(_LOCAL, buf, at + off, at + cd_off, f"the local header of {label}")
        if lh[0] != 0x04034B50 or lh[1:6] != f[2:7] or lh[9] != len(name):
            raise _Bad(off, f"the local header of {label} disagrees with its central entry")
        if bytes(buf[at + off + 30 : at + off + 30 + len(name)]) != name:
            raise _Bad(off + 30, f"the local header of {label} names another record")
        x, xend = at + off + 30 + len(name), at + off + 30 + len(name) + lh[10]
        while x < xend:
            xid, xl = _u(struct.Struct("<HH"), buf, x, xend, "an extra field")
            if xid != _PAD_ID or x + 4 + xl > xend or (xl and buf.find(b"Z" * xl, x + 4, x + 4 + xl) != x + 4):
                raise _Bad(x - at, f"the padding of {label} is damaged")
            x += 4 + xl
        data = xend
        if f[3] & 8:  # sizes and CRC in a data descriptor after the data (torch.save's way)
            if lh[6:9] != (0, 0, 0):
                raise _Bad(off + 14, f"the local header of {label} is damaged")
            desc_st = _DESC64 if size >= _BIG else _DESC
            d = _u(desc_st, buf, data + size, at + cd_off, f"the data descriptor of {label}")
            if d[0] != 0x08074B50 or d[1] != f[7] or d[2] != size or d[3] != size:
                raise _Bad(data + size - at, f"the data descriptor of {label} disagrees with its central entry")
            next_at = data + size + desc_st.size - at
        else:
            if lh[6:9] != (f[7], f[8] if f[8] != _BIG else lh[7], f[9] if f[9] != _BIG else lh[8]):
                raise _Bad(off + 14, f"the local header of {label} disagrees with its central entry")
            next_at = data + size - at
        out.append((data, size, f[7], label))
    if next_at != cd_off:
        raise _Bad(next_at, "bytes between the last record and the central directory")
    return out


# The records whose bytes differ between containers of one layout: a tensor's data, and the
# id torch.save gives each of its calls (hostreg's writer: one per file).
_VARIES = re.compile(r"(^|/)(data/\d+|\.data/serialization_id)$")


class _Template:
    """A container checked in full by :func:`check_container`, for containers of the same
    length: those whose bytes equal its bytes outside the records' bytes and their CRC-32
    fields (a central entry's, a data descriptor's) have its structure, so only their
    CRC-32s remain to check. (Containers of one dtype and shape are laid out alike.)"""

    __slots__ = ("fixed", "records")

    def __init__(self, buf: Any, at: int, length: int, records: list[tuple[int, int, int, str]]) -> None:
        crc_fields = []
        self.records = []  # (start, size, [offsets of its CRC fields], name), relative to the container
        central = self._central_crcs(buf, at, length)
        for (start, size, _, name), field in zip(sorted(records), central):
            if not _VARIES.search(name):
                continue  # the same bytes in every container of this layout: compared whole
            fields = [field]
            if buf.find(b"PK\x07\x08", start + size, start + size + 4) == start + size:
                fields.append(start + size + 4 - at)
            crc_fields += fields
            self.records.append((start - at, size, fields, name))
        holes = sorted([(r[0], r[0] + r[1]) for r in self.records] + [(f, f + 4) for f in crc_fields])
        self.fixed = []
        pos = 0
        for a, b in holes:
            if a > pos:
                self.fixed.append((pos, a, bytes(buf[at + pos : at + a])))
            pos = max(pos, b)
        if pos < length:
            self.fixed.append((pos, length, bytes(buf[at + pos : at + length])))

    @staticmethod
    def _central_crcs(buf: Any, at: int, length: int) -> list[int]:
        """Offsets (relative to ``at``) of each central entry's CRC-32 field, in the order of
        their records in the container."""
        out = []
        pos = buf.find(b"PK\x01\x02", at, at + length)
        while 0 <= pos < at + length:
            f = _CENTRAL.unpack_from(buf, pos)
            out.append((f[16], pos + 16 - at))
            nxt = pos + 46 + f[10] + f[11] + f[12]
            pos = nxt if buf.find(b"PK\x01\x02", nxt, nxt + 4) == nxt else -1
        return [o for _, o in sorted(out)]

    def match(self, buf: Any, at: int) -> list[tuple[int, int, int, str]] | None:
        for a, b, want in self.fixed:
            if buf.find(want, at + a, at + b) != at + a:
                return None
        out = []
        for start, size, fields, name in self.records:
            crcs = {struct.unpack_from("<I", buf, at + f)[0] for f in fields}
            if len(crcs) != 1:
                return None
            out.append((at + start, size, crcs.pop(), name))
        return out


class Checker:
    """:func:`check_container` for many containers, most of them recognised by a template of
    an earlier one of their length (:class:`_Template`): a few byte comparisons each."""

    def __init__(self) -> None:
        self.templates: dict[int, list[_Template]] = {}

    def check(self, buf: Any, at: int, length: int) -> list[tuple[int, int, int, str]]:
        known = self.templates.get(length, ())
        for t in known:
            got = t.match(buf, at)
            if got is not None:
                return got
        records = check_container(buf, at, length)
        if len(known) < 4:
            self.templates.setdefault(length, []).append(_Template(buf, at, length, records))
        return records


def check_crcs(buf_base: int, records: list[tuple[int, int, int, str, Any]], threads: int = 0) -> list:
    """The records (start, length, CRC-32, name, tag) whose bytes at ``buf_base + start`` do
    not have their CRC-32, computed in one ``hostregCrc32Batch``."""
    if not records:
        return []
    code, got = _hostreg.crc32_batch([buf_base + r[0] for r in records], [r[1] for r in records], threads)
    if code != 0:
        raise MemoryError("no memory to checksum the checkpoint")
    return [r for r, c in zip(records, got) if c != r[2]]


def _zeros(buf: Any, start: int, end: int, piece: int = 1 << 20) -> bool:
    """Are ``buf[start:end]`` all zero bytes? (A MiB at a time: a sparse file's hole may be
    large.)"""
    for at in range(start, end, piece):
        if bytes(buf[at : min(end, at + piece)]).strip(b"\0"):
            return False
    return True


def _address(buf: Any) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf)) if len(buf) else 0


def check_file(
    path: str, items: list[tuple[str, int, int]], threads: int = 0, opaque: frozenset = frozenset()
) -> list[Problem]:
    """Every problem of file ``path`` whose containers are ``items`` ((key, offset, length),
    from the metadata): each container's structure and records' CRC-32s, and zeros between
    and after them. Items at the offsets in ``opaque`` went through DCP's stream transforms
    (``_extensions``): their bytes are the transform's, so only their place is checked. The
    file is mapped (copy on write: nothing is written to it)."""
    name = os.path.basename(path)
    problems: list[Problem] = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return [Problem(name, items[0][0] if items else "", 0, "the file is empty")] if items else []
        buf = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        base = _address(buf)
        checker = Checker()
        records: list = []
        pos = 0
        for key, off, length in sorted(items, key=lambda i: i[1]):
            if off + length > size:
                problems.append(Problem(name, key, off, f"runs past the end of the file ({size:,} bytes)"))
                continue
            if off > pos and not _zeros(buf, pos, off):
                problems.append(Problem(name, "", pos, "bytes between containers that should be zero are not"))
            pos = max(pos, off + length)
            if off in opaque:
                continue
            try:
                for start, n, crc, rec in checker.check(buf, off, length):
                    records.append((start, n, crc, rec, key))
            except _Bad as b:
                problems.append(Problem(name, key, off + b.offset, b.what))
        if pos < size and not _zeros(buf, pos, size):
            problems.append(Problem(name, "", pos, "bytes after the last container that should be zero are not"))
        for start, _, _, rec, key in check_crcs(base, records, threads):
            problems.append(Problem(name, key, start, f"the bytes of record {rec} do not have their CRC-32"))
    finally:
        buf.close()
    return problems


@dataclass
class Report:
    """What :func:`verify_checkpoint` checked, and every problem it found."""

    metadata: list[str]  # the metadata files read
    files: int
    items: int
    nbytes: int  # bytes of the data files checked
    problems: list[Problem]


def verify_checkpoint(path: str, *, trusted: bool = False, only: set[str] | None = None, threads: int = 0) -> Report:
    """Checks every byte of the checkpoint in directory ``path`` (see the module docstring):
    its ``.metadata`` (or, without one, each ``__{rank}.metadata``) read as the reader reads
    it (``trusted`` as there), with its CRC-32 where hostreg wrote it; then every data file the
    metadata names (``only``: just these file names). A problem is reported, not raised."""
    names = [".metadata"] if os.path.exists(os.path.join(path, ".metadata")) else []
    if not names:
        names = sorted(n for n in os.listdir(path) if n.startswith("__") and n.endswith(".metadata"))
    report = Report(names, 0, 0, 0, [])
    if not names:
        report.problems.append(Problem(".metadata", "", 0, "no metadata file: not a checkpoint"))
        return report
    with collector_paused():  # a few objects per item: no full collections over them all meanwhile
        _verify(path, names, trusted, only, threads, report)
    return report


def _verify(path: str, names: list[str], trusted: bool, only: set[str] | None, threads: int, report: Report) -> None:
    from .metadata_read import UntrustedMetadataError, check_storage, load_metadata

    for name in names:
        try:
            md = load_metadata(os.path.join(path, name), trusted)
            check_storage(md, path)
        except (UntrustedMetadataError, ValueError, OSError) as e:
            report.problems.append(Problem(name, "", 0, str(e)))
            continue
        check_files(path, md, only, threads, report)


def check_files(path: str, metadata: Any, only: set[str] | None, threads: int, report: Report) -> None:
    """Adds to ``report`` what it checked and every problem of the data files of checkpoint
    ``path`` that ``metadata`` (its ``storage_data``, already held to ``check_storage``)
    names; ``only``: just these file names."""
    per_file: dict[str, list[tuple[str, int, int]]] = {}
    opaque: dict[str, set[int]] = {}  # offsets of items with stream transforms, per file
    for index, info in metadata.storage_data.items():
        if only is None or info.relative_path in only:
            per_file.setdefault(info.relative_path, []).append((index.fqn, info.offset, info.length))
            if getattr(info, "transform_descriptors", None):
                opaque.setdefault(info.relative_path, set()).add(info.offset)
    for rel, items in sorted(per_file.items()):
        full = os.path.join(path, rel)
        report.files += 1
        report.items += len(items)
        try:
            report.nbytes += os.path.getsize(full)
            report.problems += check_file(full, items, threads, frozenset(opaque.get(rel, ())))
        except OSError as e:
            report.problems.append(Problem(rel, items[0][0], 0, f"cannot be read: {e.strerror or e}"))
