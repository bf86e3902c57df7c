"""DCP's ``Metadata`` pickled from templates: a few microseconds an item, where ``pickle.dumps``
takes 20-30 (docs/planning.md, "The metadata's pickle").

``pickle.dumps`` of a ``Metadata`` reduces every object of every item (its
``TensorStorageMetadata``, ``TensorProperties``, each ``torch.Size``, each chunk, each
``MetadataIndex`` and ``_StorageInfo``) through ``__reduce_ex__``, and memoizes each in a
table that grows with the items. :func:`dumps` writes the same opcodes of Python's pickle
protocol 4 (``Lib/pickletools.py``) itself:

- each global (class, function, dtype) and each key of the objects' states is memoized once,
  in a head that pushes it, memoizes it and pops it (``MEMOIZE``, ``POP``), and referred to
  after with ``BINGET``;
- each dataclass of DCP's (``TensorStorageMetadata``, ``ChunkStorageMetadata``,
  ``MetadataIndex``, ``_StorageInfo``, ``BytesStorageMetadata``) is written as its reduce is:
  its class, ``EMPTY_TUPLE``, ``NEWOBJ``, then its state dict (its ``__getstate__`` where it
  has one, else its ``__dict__``) and ``BUILD``;
- ints, strings and ``torch.Size`` values are written as ``pickle`` writes them (``BININT1``,
  ``SHORT_BINUNICODE``, ``torch.Size`` and a tuple then ``REDUCE``; equal sizes from one
  cache); a ``TensorProperties`` is pickled by Python's own pickler, once per distinct state,
  and its bytes repeated; anything else is pickled by ``pickle`` in fast mode (no memo).

Only globals and keys are memoized: two equal sizes load as two objects, as two objects whose
``pickle.dumps`` shared nothing would. The result unpickles to a ``Metadata`` equal, field by
field and type by type, to ``pickle.loads(pickle.dumps(metadata))``. That is checked once per
process on a sample that holds every kind written here (:func:`_verified`); where it does
not hold (a torch whose classes pickle otherwise), :func:`dumps` is ``pickle.dumps``.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import struct
import threading
from operator import attrgetter
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

# Opcodes of protocol 4 (Lib/pickletools.py).
_PROTO4 = b"\x80\x04"
_FRAME = struct.Struct("<BQ")  # FRAME (0x95) and its length
_NEWOBJ_STATE = b")\x81}("  # EMPTY_TUPLE NEWOBJ EMPTY_DICT MARK: an object, then its state's items
_END_STATE = b"ub"  # SETITEMS BUILD
_EMPTY_DICT_MARK = b"}("
_SETITEMS, _APPEND, _APPENDS, _MARK, _POP, _MEMOIZE = b"u", b"a", b"e", b"(", b"0", b"\x94"
_NONE, _STOP = b"N", b"."
_TUPLES = {0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}


def _tuple(items: bytes, n: int) -> bytes:
    """A tuple of the ``n`` objects that ``items`` pushes, as pickle writes one (``TUPLE1-3``
    after them, else ``MARK`` before and ``TUPLE`` after)."""
    return items + _TUPLES[n] if n <= 3 else _MARK + items + b"t"


_FRAME_BYTES = 1 << 16  # pickle's own frame size


def _int(v: int) -> bytes:
    """``v`` as ``pickle`` writes an int with protocol 2 and later (``save_long``)."""
    if 0 <= v <= 0xFF:
        return b"K" + v.to_bytes(1, "little")
    if 0 <= v <= 0xFFFF:
        return b"M" + v.to_bytes(2, "little")
    if -0x80000000 <= v <= 0x7FFFFFFF:
        return b"J" + v.to_bytes(4, "little", signed=True)
    enc = pickle.encode_long(v)
    if len(enc) < 256:
        return b"\x8a" + len(enc).to_bytes(1, "little") + enc
    return b"\x8b" + len(enc).to_bytes(4, "little", signed=True) + enc


def _str(s: str) -> bytes:
    """``s`` as ``pickle`` writes a str with protocol 4 (``save_str``)."""
    b = s.encode("utf-8", "surrogatepass")
    n = len(b)
    if n < 256:
        return b"\x8c" + n.to_bytes(1, "little") + b
    if n > 0xFFFFFFFF:
        return b"\x8d" + n.to_bytes(8, "little") + b
    return b"X" + n.to_bytes(4, "little") + b


def _get(idx: int) -> bytes:
    return b"h" + idx.to_bytes(1, "little") if idx < 256 else b"j" + idx.to_bytes(4, "little")


class _Fallback(Exception):
    """The metadata holds what this writer does not write: ``pickle.dumps`` it instead."""


_PythonPickler: Any = pickle._Pickler  # Lib/pickle.py's, whose methods a subclass can change


class _Leaves(_PythonPickler):
    """Python's own pickler (``Lib/pickle.py``), protocol 4, unframed, whose memo holds only the
    globals it writes (classes, functions, dtypes, and their modules' and names' strings): the
    bytes it writes for an object hold no memo entry of the object's own, so they can be
    written again for an equal object once its globals are in the memo."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        super().__init__(self.out, protocol=4)
        self._in_global = 0

    def memoize(self, obj: Any) -> None:
        if self._in_global:
            super().memoize(obj)

    def save_global(self, obj: Any, name: Any = None) -> None:
        self._in_global += 1
        try:
            super().save_global(obj, name)
        finally:
            self._in_global -= 1

    def take(self, obj: Any) -> bytes:
        self.save(obj)
        b = self.out.getvalue()
        self.out.seek(0)
        self.out.truncate()
        return b


def _memoizes(b: bytes) -> bool:
    return any(op.name in ("MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT") for op, _, _ in pickletools.genops(b + _STOP))


def _fast(obj: Any) -> bytes:
    """``obj`` pickled in ``pickle``'s fast mode (no memo: globals written out, nothing
    memoized), protocol 4 unframed as protocol 3 is, without its PROTO and STOP."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=3)
    p.fast = True
    p.dump(obj)
    return buf.getvalue()[2:-1]


_props = attrgetter("dtype", "layout", "requires_grad", "memory_format", "pin_memory")
_TSM_KEYS = {"properties": None, "size": None, "chunks": None}.keys()
_CHUNK_KEYS = {"offsets": None, "sizes": None}.keys()
_INDEX_KEYS = {"fqn": None, "offset": None, "index": None}.keys()
_INFO_KEYS = {"relative_path": None, "offset": None, "length": None, "transform_descriptors": None}.keys()
_INFO_KEYS_LOADED = {"relative_path": None, "offset": None, "length": None}.keys()  # unpickled: None left out


class _Writer:
    """One pickle being written: the head (memoized globals and keys) and the templates."""

    def __init__(self) -> None:
        self.leaves = _Leaves()
        self.head: list[bytes] = []
        self.keys: dict[str, bytes] = {}
        self.globals: dict[Any, bytes] = {}
        self.sizes: dict[tuple, bytes] = {}
        self.strs: dict[str, bytes] = {}
        self.props: dict[tuple, bytes] = {}
        self.size_ref = self.ref(torch.Size)
        self.cls = {c: self.ref(c) for c in (TensorStorageMetadata, ChunkStorageMetadata, MetadataIndex, _StorageInfo)}
        self.bytes_md = self.ref(BytesStorageMetadata) + b")\x81"  # its state is empty: no BUILD (as pickle)
        k = self.key
        self.tsm_head = self.cls[TensorStorageMetadata] + _NEWOBJ_STATE + k("properties")
        self.k_size, self.k_chunks = k("size"), k("chunks")
        self.chunk_head = self.cls[ChunkStorageMetadata] + _NEWOBJ_STATE + k("offsets")
        self.k_sizes = k("sizes")

    def ref(self, obj: Any) -> bytes:
        """Bytes that push the global ``obj`` (a class): a memo reference, the global memoized
        in the head first."""
        got = self.globals.get(obj)
        if got is None:
            got = self.globals[obj] = self.leaf(obj)
        return got

    def key(self, s: str) -> bytes:
        """Bytes that push the string ``s`` (a key of the objects' states), memoized once."""
        got = self.keys.get(s)
        if got is None:
            idx = len(self.leaves.memo)
            self.leaves.memo[id(s)] = idx, s
            self.head.append(_str(s) + _MEMOIZE + _POP)
            got = self.keys[s] = _get(idx)
        return got

    def leaf(self, obj: Any) -> bytes:
        """Bytes that push an object equal to ``obj``, written by :class:`_Leaves`: the first
        time, the globals it names go into the head."""
        warm = self.leaves.take(obj)
        again = self.leaves.take(obj)
        if _memoizes(again):
            raise _Fallback
        if warm != again:
            self.head.append(warm + _POP)
        return again

    def string(self, s: Any) -> bytes:
        if type(s) is not str:
            return self.value(s)
        got = self.strs.get(s)
        if got is None:
            got = self.strs[s] = _str(s)
        return got

    def size(self, s: Any) -> bytes:
        """A ``torch.Size`` (or any other value) as pickle writes it, from a cache per size."""
        if type(s) is not torch.Size:
            return self.value(s)
        got = self.sizes.get(s)
        if got is None:
            if any(type(v) is not int for v in s):
                return self.leaf(s)
            got = self.size_ref + _tuple(b"".join(map(_int, s)), len(s)) + b"\x85R"  # TUPLE1 REDUCE
            self.sizes[s] = got
        return got

    def properties(self, p: Any) -> bytes:
        if type(p) is not TensorProperties:
            return self.value(p)
        state = _props(p)
        got = self.props.get(state)
        if got is None:
            got = self.props[state] = self.leaf(p)
        return got

    def value(self, v: Any) -> bytes:
        """Any other value: None, an int, a str, else pickled in fast mode."""
        t = type(v)
        if v is None:
            return _NONE
        if t is int:
            return _int(v)
        if t is str:
            return self.string(v)
        if t is torch.Size:
            return self.size(v)
        if t is TensorProperties:
            return self.properties(v)
        if t in self.cls or t is BytesStorageMetadata:
            return self.leaf(v)  # of a kind written below, but not as it is usually made: slow, rare
        return _fast(v)

    def state(self, items: Any) -> bytes:
        """A state dict's items, ``MARK``ed (keys memoized)."""
        return b"".join(self.key(k) + self.value(v) for k, v in items)

    def tensor(self, md: Any) -> bytes:
        """A value of ``state_dict_metadata`` that :meth:`tensors` does not write in its loop."""
        if type(md) is BytesStorageMetadata and not md.__dict__:
            return self.bytes_md
        if type(md) is not TensorStorageMetadata or md.__dict__.keys() != _TSM_KEYS or type(md.chunks) is not list:
            return self.value(md)
        parts = [self.tsm_head, self.properties(md.properties), self.k_size, self.size(md.size), self.k_chunks, b"]"]
        chunks = md.chunks
        if len(chunks) > 1:
            parts.append(_MARK)
        for c in chunks:
            if type(c) is ChunkStorageMetadata and c.__dict__.keys() == _CHUNK_KEYS:
                parts += (self.chunk_head, self.size(c.offsets), self.k_sizes, self.size(c.sizes), _END_STATE)
            else:
                parts.append(self.value(c))
        parts.append(_APPENDS if len(chunks) > 1 else _APPEND if chunks else b"")
        parts.append(_END_STATE)
        return b"".join(parts)

    def tensors(self, sdm: dict) -> list[bytes]:
        """The items of ``state_dict_metadata``. The usual one (a ``TensorStorageMetadata`` of
        one chunk, its properties and sizes seen before) in the loop, any other by :meth:`tensor`."""
        strs, sizes, props, Size = self.strs, self.sizes, self.props, torch.Size
        head, k_size, k_chunks, chunk_head, k_sizes = (
            self.tsm_head,
            self.k_size,
            self.k_chunks,
            self.chunk_head,
            self.k_sizes,
        )
        one = b"]" + chunk_head
        end = _END_STATE + _APPEND + _END_STATE
        join = b"".join
        out = []
        for fqn, md in sdm.items():
            fb = strs.get(fqn) if type(fqn) is str else None
            if fb is None:
                fb = self.string(fqn)
            d = md.__dict__
            if type(md) is TensorStorageMetadata and d.keys() == _TSM_KEYS:
                p, size, chunks = d["properties"], d["size"], d["chunks"]
                if type(chunks) is list and len(chunks) == 1 and type(p) is TensorProperties and type(size) is Size:
                    c = chunks[0]
                    cd = c.__dict__
                    if type(c) is ChunkStorageMetadata and cd.keys() == _CHUNK_KEYS:
                        off, sz = cd["offsets"], cd["sizes"]
                        pb, b1 = props.get(_props(p)), sizes.get(size)
                        b2 = sizes.get(off) if type(off) is Size else None
                        b3 = sizes.get(sz) if type(sz) is Size else None
                        if pb is not None and b1 is not None and b2 is not None and b3 is not None:
                            out.append(join((fb, head, pb, k_size, b1, k_chunks, one, b2, k_sizes, b3, end)))
                            continue
            out.append(fb + self.tensor(md))
        return out

    def storage(self, entries: dict) -> list[bytes]:
        """The items of ``storage_data``: ``MetadataIndex`` keys, ``_StorageInfo`` values. The
        usual ones in the loop; any other key or value by :meth:`value` (or its dataclass's
        state, item by item)."""
        strs, sizes, Size = self.strs, self.sizes, torch.Size
        key_head = self.cls[MetadataIndex] + _NEWOBJ_STATE
        info_head = self.cls[_StorageInfo] + _NEWOBJ_STATE
        k_fqn, k_offset, k_index = self.key("fqn"), self.key("offset"), self.key("index")
        k_path, k_at, k_len = self.key("relative_path"), self.key("offset"), self.key("length")
        k_td = self.key("transform_descriptors")
        join = b"".join
        out = []
        for k, v in entries.items():
            kd, vd = k.__dict__, v.__dict__
            kb = vb = None
            if type(k) is MetadataIndex and kd.keys() == _INDEX_KEYS:
                fqn, off, idx = kd["fqn"], kd["offset"], kd["index"]
                fb = strs.get(fqn) if type(fqn) is str else None
                ob = sizes.get(off) if type(off) is Size else _NONE if off is None else None
                if fb is not None and ob is not None and (idx is None or type(idx) is int):
                    ib = _NONE if idx is None else _int(idx)
                    kb = join((key_head, k_fqn, fb, k_offset, ob, k_index, ib, _END_STATE))
            if type(v) is _StorageInfo and (vd.keys() == _INFO_KEYS or vd.keys() == _INFO_KEYS_LOADED):
                path, at, n, td = vd["relative_path"], vd["offset"], vd["length"], vd.get("transform_descriptors")
                pb = strs.get(path) if type(path) is str else None
                if pb is not None and type(at) is int and type(n) is int and (td is None or td == []):
                    # _StorageInfo.__getstate__ leaves out None (filesystem.py); DCP's writer gives []
                    vb = join(
                        (
                            info_head,
                            k_path,
                            pb,
                            k_at,
                            _int(at),
                            k_len,
                            _int(n),
                            _END_STATE if td is None else k_td + b"]" + _END_STATE,
                        )
                    )
            if kb is None:
                kb = self.dataclass(k)
            if vb is None:
                vb = self.dataclass(v)
            out.append(kb + vb)
        return out

    def dataclass(self, obj: Any) -> bytes:
        """A ``MetadataIndex`` or ``_StorageInfo`` (its state written item by item), or any value."""
        if type(obj) is MetadataIndex:
            return self.cls[MetadataIndex] + _NEWOBJ_STATE + self.state(obj.__dict__.items()) + _END_STATE
        if type(obj) is _StorageInfo:
            return self.cls[_StorageInfo] + _NEWOBJ_STATE + self.state(obj.__getstate__().items()) + _END_STATE
        return self.value(obj)

    def planner(self, data: dict) -> list[bytes]:
        """The items of ``planner_data``: an fqn and its path (a tuple of keys)."""
        strs = self.strs
        out = []
        for k, v in data.items():
            kb = strs.get(k) if type(k) is str else None
            if kb is None:
                kb = self.string(k)
            if type(v) is not tuple:
                out.append(kb + self.value(v))
                continue
            out.append(kb + _tuple(b"".join(map(self.string, v)), len(v)))
        return out

    def metadata(self, metadata: Metadata) -> list[bytes]:
        """The pieces of the whole pickle after its head, each whole opcodes."""
        if type(metadata) is not Metadata:
            raise _Fallback
        body = [self.ref(Metadata) + _NEWOBJ_STATE]
        for name, field in vars(metadata).items():
            body.append(self.key(name))
            write = self._DICTS.get(name) if type(field) is dict else None
            if write is None:
                body.append(self.value(field))
                continue
            body.append(_EMPTY_DICT_MARK)
            body += write(self, field)
            body.append(_SETITEMS)
        body.append(_END_STATE + _STOP)
        return body

    _DICTS = {"state_dict_metadata": tensors, "storage_data": storage, "planner_data": planner}


def _framed(pieces: list[bytes]) -> bytes:
    """``PROTO 4`` then ``pieces`` in frames of about 64 KiB, end to end, as ``pickle`` frames
    (an unpickler reads a frame at a time; opcodes never straddle a frame: each piece is whole
    opcodes)."""
    out = [_PROTO4]
    run: list[bytes] = []
    size = 0
    for p in pieces:
        run.append(p)
        size += len(p)
        if size >= _FRAME_BYTES:
            out += (_FRAME.pack(0x95, size), *run)
            run, size = [], 0
    if run:
        out += (_FRAME.pack(0x95, size), *run)
    return b"".join(out)


def _fields(a: Any, b: Any) -> bool:
    """``a`` and ``b`` equal in type and value all the way down (containers, dataclasses' fields)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(_fields(x, y) for x, y in zip(a.items(), b.items()))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_fields, a, b))
    if hasattr(a, "__dict__") and not isinstance(a, type):  # an object's attributes, in any order
        va, vb = vars(a), vars(b)
        return va.keys() == vb.keys() and all(_fields(va[k], vb[k]) for k in va)
    return bool(a == b)


def _sample() -> Metadata:
    """A ``Metadata`` holding every kind :class:`_Writer` writes, with values of each width."""
    big = 1 << 40
    md = {
        "w": TensorStorageMetadata(
            TensorProperties(dtype=torch.bfloat16, requires_grad=True),
            torch.Size([300, 70000, 2]),
            [
                ChunkStorageMetadata(torch.Size([0, 0, 0]), torch.Size([150, 70000, 2])),
                ChunkStorageMetadata(torch.Size([150, 0, 0]), torch.Size([150, 70000, 2])),
            ],
        ),
        "x" * 300: TensorStorageMetadata(
            TensorProperties(dtype=torch.float32, memory_format=torch.channels_last, pin_memory=True),
            torch.Size([1, 2, 3, 4]),
            [ChunkStorageMetadata(torch.Size([0, 0, 0, 0]), torch.Size([1, 2, 3, 4]))],
        ),
        "s": TensorStorageMetadata(
            TensorProperties(dtype=torch.int64), torch.Size([]), [ChunkStorageMetadata(torch.Size([]), torch.Size([]))]
        ),
        "b": BytesStorageMetadata(),
    }
    storage = {
        MetadataIndex("w", [0, 0, 0], 0): _StorageInfo("__0_0.distcp", 0, big),
        MetadataIndex("w", [150, 0, 0], 1): _StorageInfo("__1_0.distcp", big, 7, ["stream.zstd"]),
        MetadataIndex("x" * 300, [0, 0, 0, 0]): _StorageInfo("\u00e9" * 10, 1 << 70, 65535),
        MetadataIndex("s", [], 0): _StorageInfo("__0_0.distcp", 256, 65536),
        MetadataIndex("b"): _StorageInfo("__0_0.distcp", -1, 0),
    }
    planner = {"w": ("w",), "x" * 300: ("a", "b", "c", "d"), "s": ("s", 0), "b": ("b",)}
    m = Metadata(state_dict_metadata=md, planner_data=planner, storage_data=storage)
    m.version = "1.0.0"
    m.other = {"anything": [1, 2.5, None]}  # a field another torch may add
    return m


_checked: bool | None = None
_check_lock = threading.Lock()


def _verified() -> bool:
    """Does :class:`_Writer` write what ``pickle.dumps`` would, in this process's torch?"""
    global _checked
    with _check_lock:
        if _checked is None:
            try:
                m = _sample()
                # The properties' cache is keyed by _props: a state of more fields than it (each in
                # its own encoding: the memory format as an enum) would be told apart by none.
                props = [md.properties for md in m.state_dict_metadata.values() if type(md) is TensorStorageMetadata]
                _checked = all(len(p.__getstate__()) == len(_props(p)) for p in props) and _fields(
                    pickle.loads(_write(m)), pickle.loads(pickle.dumps(m, protocol=4))
                )
            except Exception:
                _checked = False
        return _checked


def _write(metadata: Metadata) -> bytes:
    w = _Writer()
    body = w.metadata(metadata)
    return _framed(w.head + body)


def dumps(metadata: Metadata) -> bytes:
    """``metadata`` pickled (protocol 4, framed, ending ``SETITEMS BUILD STOP`` as
    ``pickle.dumps`` of it does): by :class:`_Writer` where it writes what ``pickle.dumps``
    would in this process's torch, else by ``pickle.dumps``. Raises what ``pickle.dumps``
    raises for an unpicklable field."""
    if _verified():
        try:
            return _write(metadata)
        except Exception:  # _Fallback, or what pickle.dumps below raises in its own words
            pass
    return pickle.dumps(metadata, protocol=4)
