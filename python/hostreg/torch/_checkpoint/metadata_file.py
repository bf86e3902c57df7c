"""``.metadata``'s bytes, pickled once per structure (docs/planning.md).

DCP's ``.metadata`` is one pickle of a ``Metadata`` object: per tensor its properties, size and
chunks (from the planner) and where its bytes lie (``storage_data``, from the writers). For a
structure saved before, with the same global plan and the same fixed parts on every rank, only
``storage_meta`` (this save's id and path) and the items written at each save (bytes items,
``fixed.py``'s rest) differ. So the pickle is made in two pieces:

- the prefix, once: the ``Metadata`` with its fields in the order ``state_dict_metadata``,
  ``planner_data``, ``version`` (and any other field torch adds), then ``storage_data`` holding
  the fixed parts' entries; pickled with protocol 4 (in frames of 64 KiB, by
  ``metadata_pickle.py``, as a whole ``Metadata`` of a first save is) and cut before its
  last three opcodes (``SETITEMS`` of the object's state, ``BUILD``, ``STOP``), the last
  frame's length shortened to match;
- the suffix, at each save: ``MARK``, the other ``storage_data`` entries, ``SETITEMS`` (into the
  dict the prefix left on top of the stack), then the key ``storage_meta`` and its value, then
  the three opcodes cut, outside any frame (protocol 4 allows opcodes between and after
  frames). It is pickled in the pickler's fast mode (no memo), so that it neither reads nor
  overwrites the prefix's memo.

The result unpickles to the same ``Metadata`` as ``pickle.dump`` of it would (the opcodes are
Python's pickle protocol, ``Lib/pickletools.py``), with one more attribute: the index of
``index.py`` (a ``bytes`` value, the state's last item, its columns made once per structure
with the prefix); DCP's stock reader reads it as any other.
"""

from __future__ import annotations

import io
import pickle
import struct
import threading
from collections import OrderedDict
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata

from .._collector import collector_paused
from . import index as _index
from . import keyed, metadata_pickle

_CUT = b"ub."  # SETITEMS, BUILD, STOP: the end of a pickled object whose state is a dict of 2+ items


class Results(list):
    """A rank's write results, the first ``len(fixed)`` of them a fixed part's (the same
    objects at every save that reuses that part; ``fixed`` is named by ``token``)."""

    def __init__(self, fixed: list, token: str | None, rest: list) -> None:
        super().__init__(fixed)
        self.extend(rest)
        self.fixed, self.token = fixed, token

    def __reduce__(self) -> Any:
        if self.token is None or keyed.sent(self.token) is not self.fixed:
            return (list, (list(self),))
        return (_rebuild, (self.token, keyed.blob(self.token), self[len(self.fixed) :]))


def _rebuild(token: str, blob: bytes, rest: list) -> Results:
    return Results(keyed.rebuild(token, blob), token, rest)


def _fast(obj: Any) -> bytes:
    """``obj`` pickled without memo, without its PROTO and STOP opcodes."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=3)
    p.fast = True
    p.dump(obj)
    return buf.getvalue()[2:-1]


def _shape(metadata: Metadata) -> dict[str, Any]:
    """The fields a prefix holds: all but ``storage_data`` and ``storage_meta``."""
    return {k: v for k, v in vars(metadata).items() if k not in ("storage_data", "storage_meta")}


class _Prefix:
    __slots__ = ("fields", "fixed", "storage_data", "prefix", "body")

    def __init__(
        self, fields: dict[str, Any], fixed: list[list], storage_data: dict, prefix: bytes, body: _index.Body | None
    ) -> None:
        self.fields, self.fixed, self.storage_data, self.prefix, self.body = fields, fixed, storage_data, prefix, body

    def fits(self, fields: dict[str, Any], fixed: list) -> bool:
        """Made of these very fields (the planner's remembered objects: compared by identity;
        strings by value) and fixed parts?"""
        return (
            fields.keys() == self.fields.keys()
            and all(v is self.fields[k] or (type(v) is str and v == self.fields[k]) for k, v in fields.items())
            and len(fixed) == len(self.fixed)
            and all(a is b for a, b in zip(fixed, self.fixed))
        )


def _make_prefix(fields: dict[str, Any], fixed: list[list]) -> _Prefix:
    storage_data = {wr.index: wr.storage_data for wrs in fixed for wr in wrs}
    state = dict(fields)
    state["storage_data"] = storage_data
    pre = Metadata.__new__(Metadata)
    pre.__dict__.update(state)
    with collector_paused():  # a reduce tuple per object pickled: no full collections over them meanwhile
        raw = metadata_pickle.dumps(pre)
        try:
            body: _index.Body | None = _index.Body(
                fields["state_dict_metadata"], fields.get("planner_data"), storage_data
            )
        except _index.Unindexable:
            body = None
    if len(state) < 2 or not raw.endswith(_CUT):
        raise AssertionError("unexpected pickle of Metadata")  # the state is a dict of 2+ items
    return _Prefix(fields, fixed, storage_data, _cut_frames(raw, len(_CUT)), body)


def _with_index(index: bytes | None) -> bytes:
    """The opcodes that add ``index`` as the state's last item (nothing for None)."""
    return b"" if index is None else _fast(_index.KEY) + _fast(index)


_FRAME = struct.Struct("<BQ")  # protocol 4's FRAME opcode (0x95) and the frame's length


def _cut_frames(raw: bytes, cut: int) -> bytes:
    """``raw`` (a protocol 4 pickle) without its last ``cut`` bytes, the last frame's length
    shortened to match. Frames let an unpickler read a file 64 KiB at a time (a restricted
    ``pickle.Unpickler`` reads an unframed file an opcode at a time: twice as slow). Where the
    pickle is not frames end to end (a large bytes object is written outside any frame), it is
    pickled again unframed, with protocol 3."""
    at, last = 2, -1
    while at < len(raw) and raw[at] == 0x95:
        last = at
        at += _FRAME.size + _FRAME.unpack_from(raw, at)[1]
    if at != len(raw) or last < 0 or _FRAME.unpack_from(raw, last)[1] < cut:
        raw = pickle.dumps(pickle.loads(raw), protocol=3)
        return raw[:-cut]
    head = bytearray(raw[:-cut])
    _FRAME.pack_into(head, last, 0x95, _FRAME.unpack_from(raw, last)[1] - cut)
    return bytes(head)


_KEEP = 2
_lock = threading.Lock()
_prefixes: OrderedDict[tuple, _Prefix] = OrderedDict()


def metadata_bytes(metadata: Metadata, results: list[list]) -> bytes:
    """The pickle of ``metadata`` whose ``storage_data`` is (set here) every entry of
    ``results`` (a list per rank), as ``pickle.dumps`` would give it: from a remembered prefix
    where every rank's results begin with a fixed part, else pickled whole."""
    fixed = [getattr(r, "fixed", None) for r in results]
    if any(f is None for f in fixed):
        metadata.storage_data = {wr.index: wr.storage_data for wrs in results for wr in wrs}
        with collector_paused():
            raw = metadata_pickle.dumps(metadata)
            index = _index.build(metadata)
        if index is None or not raw.endswith(_CUT):
            return raw
        return _cut_frames(raw, len(_CUT)) + _with_index(index) + _CUT
    fields = _shape(metadata)
    key = (*map(id, fields.values()), *map(id, fixed))
    with _lock:
        got = _prefixes.get(key)
    if got is None or not got.fits(fields, fixed):
        got = _make_prefix(fields, fixed)  # type: ignore[arg-type]
        with _lock:
            _prefixes[key] = got
            _prefixes.move_to_end(key)
            while len(_prefixes) > _KEEP:
                _prefixes.popitem(last=False)
    rest = {wr.index: wr.storage_data for r, f in zip(results, fixed) for wr in r[len(f) :]}  # type: ignore[arg-type]
    metadata.storage_data = {**got.storage_data, **rest} if rest else got.storage_data.copy()
    suffix = b""
    if rest:
        suffix += b"(" + b"".join(_fast(k) + _fast(v) for k, v in rest.items()) + b"u"
    suffix += _fast("storage_meta") + _fast(metadata.storage_meta)
    index = None
    if got.body is not None:
        try:
            index = got.body.finish(rest, {k: v for k, v in vars(metadata).items() if k not in _index.OWN})
        except _index.Unindexable:
            pass
    return got.prefix + suffix + _with_index(index) + _CUT


def clear() -> None:
    with _lock:
        _prefixes.clear()
