"""A compact index of a checkpoint's ``Metadata``, carried inside ``.metadata`` (docs/checkpoint.md,
"The index in .metadata").

DCP's ``.metadata`` is one pickle of a ``Metadata``: unpickling it makes about 15 Python objects
an item (65,536 items: over a second, and a full collection of Python's cyclic collector over
them after), before a load has read a byte of data. hostreg's writer adds the same facts in
columns, as one more ``bytes`` value of the pickled object's state (key ``_hostreg_index``,
pickled last): DCP's reader, and older hostreg readers, unpickle it as an attribute they never
look at; hostreg's reader finds it at the end of the pickle without unpickling the rest
(:func:`find`), and gives DCP a ``Metadata`` whose ``state_dict_metadata``, ``storage_data``
and ``planner_data`` are mappings that make an entry's objects when it is looked up
(:class:`Index`). hostreg's ``LoadPlanner`` plans from the columns, and hostreg's reader reads
from them, without those objects.

Layout (little-endian; ``q``: int64 arrays of Python's ``array`` module):

====================  ===========================================================================
``names``             the fqns, UTF-8, each followed by a NUL
``dtypes``            the dtypes' names in ``torch`` (``float32``), each followed by a NUL
``files``             the files' names, each followed by a NUL
``fqn columns``       ``q`` x 5 per fqn: kind (0 bytes, 1 tensor), dtype (its place in
                      ``dtypes``), flags (1: ``requires_grad``, 2: ``pin_memory``), ndim, chunks
``sizes``             ``q``: each tensor's size (ndim values)
``geometry``          ``q``: each tensor chunk's offsets then sizes (ndim values each)
``storage``           ``q`` x 3 per chunk (a bytes item is one chunk): file (its place in
                      ``files``; -1: given by the patch), byte offset, byte length
``planner data``      ``planner_data`` (DCP's: fqn -> the path of keys it flattens), pickled as the
                      pair (the fqns whose path is not their ``.``-split, with their paths;
                      True where its fqns are ``names``, else False: then the first holds
                      all); empty for None
``patch files``       file names, as ``files``, of the patch
``patch``             ``q`` x 4 per entry: chunk, file (in ``patch files``), offset, length
``fields``            the ``Metadata``'s other fields (``storage_meta``, ``version``), a pickled dict
``header``            ``<`` then 13 ``Q``: the byte lengths of the eleven sections above, the
                      number of fqns and of chunks
``footer``            ``<Q4s``: the index's whole length and ``HRX1``
====================  ===========================================================================

The sections before the patch depend only on the structure and the layout of the tensors a
save writes from their own memory (``fixed.py``): made once per structure. The patch gives
the storage of the items laid out at each save (bytes items), and the fields this save's.

Only metadata the columns describe whole gets an index: tensors of layout ``strided`` and
memory format ``contiguous_format``, bytes items, entries with no stream transforms and with
offsets and lengths that are int64 byte counts, names without NUL. Anything else is saved without one, and read by unpickling as before.
"""

from __future__ import annotations

import io
import operator
import pickle
import struct
from array import array
from collections.abc import ItemsView, Iterator, KeysView, Mapping
from itertools import chain, repeat
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from .._layout import int64_tensor

_shape = operator.attrgetter("shape")
KEY = "_hostreg_index"  # the attribute's name in the pickled state
_HEADER = struct.Struct("<13Q")
_FOOTER = struct.Struct("<Q4s")
_MAGIC = b"HRX1"
_BYTES, _TENSOR = 0, 1
_GRAD, _PINNED = 1, 2


class Unindexable(Exception):
    """Raised while building an index where the metadata holds what the columns cannot say."""


def _key(index: Any) -> tuple[str, tuple[int, ...] | None]:
    """A ``MetadataIndex`` as DCP's equality sees it: its fqn and its offset (index ignored)."""
    return index.fqn, None if index.offset is None else tuple(index.offset)


def _where(info: Any, files: dict[str, int]) -> tuple[int, int, int]:
    """A ``_StorageInfo`` as the columns hold it: (its file's place in ``files``, added there
    if new; offset; length). Raises :class:`Unindexable` for stream transforms, or a file name
    or byte counts the columns cannot hold."""
    rel, off, length = info.relative_path, info.offset, info.length
    if (
        getattr(info, "transform_descriptors", None)
        or type(rel) is not str
        or type(off) is not int
        or type(length) is not int
        or not 0 <= off < 1 << 63
        or not 0 <= length < 1 << 63
    ):
        raise Unindexable
    return files.setdefault(rel, len(files)), off, length


def _names(names: list[str]) -> bytes:
    if any("\0" in n for n in names):
        raise Unindexable
    return "".join(n + "\0" for n in names).encode()


class Body:
    """The sections of an index up to the patch, made from one save's ``Metadata`` fields
    (``state_dict_metadata``, ``planner_data``) and the storage of the entries known then
    (``storage``: ``MetadataIndex`` -> ``_StorageInfo``); the others are left to the patch.
    ``slots`` maps (fqn, chunk offsets) of every chunk to its place. Raises
    :class:`Unindexable`."""

    def __init__(self, sdm: Mapping, planner_data: Any, storage: Mapping) -> None:
        names = list(sdm)
        dtypes: dict[torch.dtype, int] = {}
        files: dict[str, int] = {}
        cols, sizes, geom, stor = array("q"), array("q"), array("q"), array("q")
        slots: dict[tuple, int] = {}
        known = {_key(k): info for k, info in storage.items()}
        left_open = 0
        contiguous, strided = torch.contiguous_format, torch.strided
        for fqn in names:
            md = sdm[fqn]
            if type(md) is BytesStorageMetadata:
                cols.extend((_BYTES, 0, 0, 0, 1))
                keys: list[tuple[str, tuple[int, ...] | None]] = [(fqn, None)]
            elif type(md) is TensorStorageMetadata:
                p = md.properties
                if p.layout != strided or p.memory_format != contiguous or type(p.dtype) is not torch.dtype:
                    raise Unindexable
                flags = (_GRAD if p.requires_grad else 0) | (_PINNED if p.pin_memory else 0)
                ndim = len(md.size)
                cols.extend((_TENSOR, dtypes.setdefault(p.dtype, len(dtypes)), flags, ndim, len(md.chunks)))
                sizes.extend(md.size)
                keys = []
                for c in md.chunks:
                    if len(c.offsets) != ndim or len(c.sizes) != ndim:
                        raise Unindexable
                    geom.extend(c.offsets)
                    geom.extend(c.sizes)
                    keys.append((fqn, tuple(c.offsets)))
            else:
                raise Unindexable
            for key in keys:
                slots[key] = len(slots)
                info = known.get(key)
                if info is None:
                    stor.extend((-1, 0, 0))
                    left_open += 1
                else:
                    stor.extend(_where(info, files))
        if len(slots) != len(storage) + left_open:
            raise Unindexable  # a storage entry that is no chunk of the metadata
        planner = b""
        if planner_data is not None:
            same = planner_data.keys() == sdm.keys()
            odd = {k: v for k, v in planner_data.items() if v != tuple(k.split("."))} if same else dict(planner_data)
            planner = pickle.dumps((odd, same), protocol=4)
        self.sections = [
            _names(names),
            _names([str(d).removeprefix("torch.") for d in dtypes]),
            _names(list(files)),
            cols.tobytes(),
            sizes.tobytes(),
            geom.tobytes(),
            stor.tobytes(),
            planner,
        ]
        self.blob = b"".join(self.sections)
        self.counts = (len(names), len(slots))
        self.slots = slots

    def finish(self, rest: Mapping, fields: dict[str, Any]) -> bytes:
        """The whole index: this body, a patch giving the storage of ``rest``
        (``MetadataIndex`` -> ``_StorageInfo``: entries this body left open), and the
        ``Metadata``'s ``fields`` besides those the body holds. Raises :class:`Unindexable`."""
        files: dict[str, int] = {}
        patch = array("q")
        for k, info in rest.items():
            slot = self.slots.get(_key(k))
            if slot is None:
                raise Unindexable
            patch.append(slot)
            patch.extend(_where(info, files))
        pf, pb = _names(list(files)), patch.tobytes()
        fb = pickle.dumps(fields, protocol=4)
        header = _HEADER.pack(*map(len, self.sections), len(pf), len(pb), len(fb), *self.counts)
        n = len(self.blob) + len(pf) + len(pb) + len(fb) + len(header) + _FOOTER.size
        return b"".join((self.blob, pf, pb, fb, header, _FOOTER.pack(n, _MAGIC)))


OWN = ("state_dict_metadata", "planner_data", "storage_data")  # the fields the columns hold


def build(metadata: Any) -> bytes | None:
    """The index of a whole ``Metadata``, or None where it cannot have one."""
    try:
        body = Body(metadata.state_dict_metadata, metadata.planner_data, metadata.storage_data)
        return body.finish({}, {k: v for k, v in vars(metadata).items() if k not in OWN})
    except Unindexable:
        return None


def find(raw: bytes, n: int) -> memoryview | None:
    """The index inside ``raw[:n]`` (a pickle as the writer ends it: the index pickled as the
    state's last value, with opcode ``B`` or ``C``, then SETITEMS, BUILD, STOP), or None."""
    if n < _FOOTER.size + 3 or raw[n - 3 : n] != b"ub.":
        return None
    end = n - 3
    length, magic = _FOOTER.unpack_from(raw, end - _FOOTER.size)
    if magic != _MAGIC or length > end - 5:
        return None
    start = end - length
    if raw[start - 5] == 0x42 and struct.unpack_from("<I", raw, start - 4)[0] == length:  # BINBYTES
        return memoryview(raw)[start:end]
    if raw[start - 2] == 0x43 and raw[start - 1] == length:  # SHORT_BINBYTES
        return memoryview(raw)[start:end]
    return None


class BadIndex(ValueError):
    """The index is not what hostreg's writer makes (damaged, or made by someone else)."""


def _split(data: bytes) -> list[str]:
    if data and data[-1:] != b"\0":
        raise BadIndex("a name list does not end in NUL")
    return data.decode().split("\0")[:-1] if data else []


def _q(data: bytes, width: int = 1) -> torch.Tensor:
    """A column's int64 values, as a tensor of ``width`` values a row."""
    if len(data) % (8 * width):
        raise BadIndex(f"a column's length is not a whole number of {width} int64")
    if not data:
        return torch.zeros((0, width), dtype=torch.int64)
    return torch.frombuffer(bytearray(data), dtype=torch.int64).view(-1, width)


class Index:
    """An index read back (:func:`find`): its columns as lists, and the objects of DCP's
    ``Metadata`` made per entry when asked for (:meth:`entry`, :meth:`info`, :meth:`key`).
    Raises :class:`BadIndex` where the columns do not hold together."""

    def __init__(self, view: memoryview, source: str) -> None:
        self.source = source
        if len(view) < _HEADER.size + _FOOTER.size:
            raise BadIndex("too short")
        h = _HEADER.unpack_from(view, len(view) - _FOOTER.size - _HEADER.size)
        lens, (n_fqn, n_chunk) = h[:11], h[11:]
        if sum(lens) + _HEADER.size + _FOOTER.size != len(view):
            raise BadIndex("its sections do not add up to its length")
        parts, at = [], 0
        for n in lens:
            parts.append(bytes(view[at : at + n]))
            at += n
        names, dtypes, files, cols, sizes, geom, stor, planner, pfiles, patch, fields = parts
        self.names = _split(names)
        self.row = dict(zip(self.names, range(len(self.names))))
        self.dtypes = []
        for name in _split(dtypes):
            d = vars(torch).get(name)
            if not isinstance(d, torch.dtype):
                raise BadIndex(f"{name!r} is not a torch dtype")
            self.dtypes.append(d)
        self.files = _split(files)
        c, st, p = _q(cols, 5), _q(stor, 3), _q(patch, 4)
        if len(c) != n_fqn or len(self.names) != n_fqn or len(self.row) != n_fqn or len(st) != n_chunk:
            raise BadIndex("its counts differ from its columns")
        pnames = _split(pfiles)
        slot, f = p[:, 0], p[:, 1]
        if len(p) and not (
            bool(((slot >= 0) & (slot < n_chunk) & (f >= 0) & (f < len(pnames))).all())
            and bool((st[slot, 0] == -1).all())
            and len(slot.unique()) == len(slot)
        ):
            raise BadIndex("a patch entry names no open chunk")
        st[slot, 0] = f + len(self.files)
        st[slot, 1:] = p[:, 2:]
        self.files += pnames
        file, off, length = st.unbind(1)
        if len(st) and not bool(((file >= 0) & (file < len(self.files))).all()):
            raise BadIndex("a chunk names no file")
        if bool(((off < 0) | (length < 0) | (off > (1 << 63) - 1 - length)).any()):
            raise BadIndex("an offset or a length is negative, or they pass 2**63 bytes")
        chunk_columns = (file.contiguous(), off.contiguous(), length.contiguous())
        self.file, self.offset, self.length = file.tolist(), off.tolist(), length.tolist()
        self._sizes, self._geom = _q(sizes).view(-1), _q(geom).view(-1)
        self.sizes, self.geom = self._sizes.tolist(), self._geom.tolist()
        kind, dt, flags, nd, k = c.unbind(1)
        self.kind, self.dtype, self.flags, self.ndim, self.nchunks = (x.tolist() for x in (kind, dt, flags, nd, k))
        # Where each fqn's size and chunks start (running sums), checked against the columns.
        tensor = kind == _TENSOR
        ok = (
            (tensor | (kind == _BYTES))
            & (nd >= 0)
            & (nd <= 64)
            & (k >= 1)
            & (k <= max(n_chunk, 1))
            & (tensor | ((nd == 0) & (k == 1)))
            & (~tensor | ((dt >= 0) & (dt < len(self.dtypes))))
        )
        if not bool(ok.all()):
            raise BadIndex("an entry's kind, ndim, chunk count or dtype is out of range")
        size, geom = torch.where(tensor, nd, 0), torch.where(tensor, 2 * nd * k, 0)
        first = [c.cumsum(0) - c for c in (k, size, geom)]
        self._columns = (first[0], *chunk_columns)
        self._per_entry = (tensor & (k == 1), size, first[1], first[2])  # for _whole and whole_rows
        self.first_chunk, self.first_size, self.first_geom = (c.tolist() for c in first)
        if (int(k.sum()), int(size.sum()), int(geom.sum())) != (n_chunk, len(self.sizes), len(self.geom)):
            raise BadIndex("its entries' chunks and sizes differ from its columns")
        self._planner = planner
        self._fields = fields
        self._entries: dict[int, Any] = {}
        self._whole_mask: torch.Tensor | None = None
        self._infos: list[Any] = [None] * n_chunk

    # -- per entry --

    def size(self, r: int) -> tuple[int, ...]:
        at = self.first_size[r]
        return tuple(self.sizes[at : at + self.ndim[r]])

    def chunk_geometry(self, r: int, j: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(offsets, sizes) of chunk ``j`` of tensor ``r``."""
        nd = self.ndim[r]
        at = self.first_geom[r] + 2 * nd * j
        return tuple(self.geom[at : at + nd]), tuple(self.geom[at + nd : at + 2 * nd])

    def _whole(self) -> torch.Tensor:
        """Per entry, is it a tensor stored whole (one chunk at offset 0, of the whole size, not
        empty)? A bool tensor, made once, over the columns at once."""
        got = self._whole_mask
        if got is None:
            one_chunk, ndim, first_size, first_geom = self._per_entry
            n = len(self.names)
            sizes, geom = self._sizes, self._geom
            # Size value e belongs to entry owner[e]; its first chunk's offset and size for
            # that dimension lie at at[e] and at[e] + ndim in the geometry.
            owner = torch.repeat_interleave(torch.arange(n), ndim)
            at = first_geom[owner] + torch.arange(len(sizes)) - first_size[owner]
            bad = (geom[at] != 0) | (geom[at + ndim[owner]] != sizes) | (sizes == 0)
            got = self._whole_mask = one_chunk & (
                torch.zeros(n, dtype=torch.int64).index_add_(0, owner, bad.long()) == 0
            )
        return got

    def whole_rows(self, fqns: list[str], objs: list[Any]) -> list[int | None]:
        """Per state dict entry (``fqns[j]``: ``objs[j]``), the row of the index that holds it
        whole where it is a plain ``torch.Tensor`` of that stored tensor's size (its one read
        item is all of it), else None. Tested over all entries at once: the entries' shapes are
        one column compared with the index's sizes."""
        n = len(self.names)
        plain = torch.Tensor
        at = [j for j, o in enumerate(objs) if type(o) is plain] if n else []  # (an empty index: no row)
        rs = list(map(self.row.get, map(fqns.__getitem__, at), repeat(n)))  # n: not in the index
        shapes = list(map(_shape, map(objs.__getitem__, at)))
        nd = int64_tensor(list(map(len, shapes)))
        flat = int64_tensor(list(chain.from_iterable(shapes)))
        r = int64_tensor(rs)
        known = r < n
        r = torch.where(known, r, 0)
        _, ndim, first_size, _ = self._per_entry
        ok = known & self._whole()[r] & (nd == ndim[r])
        # Shape value e belongs to entry owner[e]: compared with the stored size at pos[e].
        owner = torch.repeat_interleave(torch.arange(len(at)), nd)
        sizes = torch.cat((self._sizes, torch.zeros(1, dtype=torch.int64)))
        pos = first_size[r][owner] + torch.arange(len(flat)) - (nd.cumsum(0) - nd)[owner]
        pos = torch.where(ok[owner], pos, len(sizes) - 1)
        bad = ok[owner] & (sizes[pos] != flat)
        ok &= torch.zeros(len(at), dtype=torch.int64).index_add_(0, owner, bad.long()) == 0
        out: list[int | None] = [None] * len(objs)
        for j, row, good in zip(at, rs, ok.tolist()):
            if good:
                out[j] = row
        return out

    def entry(self, r: int) -> Any:
        """The ``TensorStorageMetadata`` or ``BytesStorageMetadata`` of entry ``r`` (made once)."""
        got = self._entries.get(r)
        if got is None:
            if self.kind[r] == _BYTES:
                got = BytesStorageMetadata()
            else:
                f = self.flags[r]
                props = TensorProperties(
                    dtype=self.dtypes[self.dtype[r]], requires_grad=bool(f & _GRAD), pin_memory=bool(f & _PINNED)
                )
                chunks = []
                for j in range(self.nchunks[r]):
                    offs, sizes = self.chunk_geometry(r, j)
                    chunks.append(ChunkStorageMetadata(offsets=torch.Size(offs), sizes=torch.Size(sizes)))
                got = TensorStorageMetadata(properties=props, size=torch.Size(self.size(r)), chunks=chunks)
            self._entries[r] = got
        return got

    def info(self, c: int) -> Any:
        """The ``_StorageInfo`` of chunk ``c`` (made once)."""
        got = self._infos[c]
        if got is None:
            got = self._infos[c] = _StorageInfo(self.files[self.file[c]], self.offset[c], self.length[c])
        return got

    def columns(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Int64 tensors: each entry's first chunk, and each chunk's file (its place in
        ``files``), byte offset and byte length."""
        return self._columns

    def key(self, r: int, j: int) -> MetadataIndex:
        """The ``MetadataIndex`` of chunk ``j`` of entry ``r``, as DCP's writers key it."""
        if self.kind[r] == _BYTES:
            return MetadataIndex(self.names[r])
        return MetadataIndex(self.names[r], torch.Size(self.chunk_geometry(r, j)[0]), j)

    def chunk_of(self, key: Any) -> int | None:
        """The chunk a ``MetadataIndex`` names (by fqn and offset, as its equality does), or None."""
        fqn = getattr(key, "fqn", None)
        r = self.row.get(fqn) if isinstance(fqn, str) else None
        if r is None:
            return None
        if self.kind[r] == _BYTES:
            return self.first_chunk[r] if key.offset is None else None
        if key.offset is None:
            return None
        want = tuple(key.offset)
        for j in range(self.nchunks[r]):
            if self.chunk_geometry(r, j)[0] == want:
                return self.first_chunk[r] + j
        return None

    def _unpickle(self, data: bytes) -> Any:
        from .metadata_read import MetadataUnpickler, _unchanged  # no class but DCP's metadata's own

        with _unchanged(self.source):
            return MetadataUnpickler(io.BytesIO(data), self.source).load()

    def planner_data(self) -> dict:
        got = self._unpickle(self._planner)
        if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], dict) and type(got[1]) is bool):
            raise BadIndex("its planner data is not what the writer makes")
        odd, same = got
        if not same:
            return odd
        return {k: odd[k] if k in odd else tuple(k.split(".")) for k in self.names}

    def metadata(self) -> Any:
        """A ``Metadata`` of this index: its other fields unpickled now (as data), its
        ``state_dict_metadata``, ``storage_data`` and ``planner_data`` mappings that make what
        is looked up (:class:`Entries`, :class:`Storage`, :class:`PlannerData`)."""
        from torch.distributed.checkpoint.metadata import Metadata

        fields = self._unpickle(self._fields)
        if not isinstance(fields, dict) or not fields.keys().isdisjoint(OWN) or not all(type(k) is str for k in fields):
            raise BadIndex("its fields name the columns' own")
        md = Metadata.__new__(Metadata)
        vars(md).update(fields)
        md.state_dict_metadata = Entries(self)
        md.storage_data = Storage(self)
        md.planner_data = PlannerData(self) if self._planner else None
        return md


class Entries(Mapping):
    """``state_dict_metadata`` from an :class:`Index`: fqn -> its storage metadata, made when
    looked up."""

    def __init__(self, index: Index) -> None:
        self.index = index

    def __getitem__(self, fqn: str) -> Any:
        return self.index.entry(self.index.row[fqn])

    def __contains__(self, fqn: object) -> bool:
        return fqn in self.index.row

    def keys(self) -> KeysView[str]:
        """The fqns: a dict's keys view (set operations with other keys at C speed)."""
        return self.index.row.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.index.names)

    def __len__(self) -> int:
        return len(self.index.names)


class Storage(Mapping):
    """``storage_data`` from an :class:`Index`: ``MetadataIndex`` -> ``_StorageInfo``, made
    when looked up."""

    def __init__(self, index: Index) -> None:
        self.index = index

    def __getitem__(self, key: Any) -> Any:
        c = self.index.chunk_of(key)
        if c is None:
            raise KeyError(key)
        return self.index.info(c)

    def __contains__(self, key: object) -> bool:
        return self.index.chunk_of(key) is not None

    def __iter__(self) -> Iterator[MetadataIndex]:
        ix = self.index
        for r in range(len(ix.names)):
            for j in range(ix.nchunks[r]):
                yield ix.key(r, j)

    def __len__(self) -> int:
        return len(self.index.file)

    def items(self) -> ItemsView:
        return _StorageItems(self)


class _StorageItems(ItemsView):
    """:class:`Storage`'s items in one pass over the chunks (not a lookup per key)."""

    def __iter__(self) -> Iterator[tuple[MetadataIndex, Any]]:
        ix = self._mapping.index  # type: ignore[attr-defined]
        for r in range(len(ix.names)):
            first = ix.first_chunk[r]
            for j in range(ix.nchunks[r]):
                yield ix.key(r, j), ix.info(first + j)


class PlannerData(Mapping):
    """``planner_data`` from an :class:`Index`, unpickled (as data) when first used."""

    def __init__(self, index: Index) -> None:
        self.index = index
        self._got: dict | None = None

    def _data(self) -> dict:
        if self._got is None:
            self._got = self.index.planner_data()
        return self._got

    def __getitem__(self, key: Any) -> Any:
        return self._data()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data())

    def __len__(self) -> int:
        return len(self._data())
