"""DCP load planner whose plan costs a few microseconds an item (docs/planning.md).

DCP's ``DefaultLoadPlanner`` makes each tensor's read items with its resharding code: the
destination's chunk list, a sweep over the saved chunks, the overlap of each pair, and a
``ReadItem`` from those (about 90 us an item in torch 2.13: 6 s for 65,536 tensors). Most
tensors of most loads need none of it: the checkpoint holds the tensor in one chunk that
covers it, and the destination is a plain tensor of that size, so the one read item is "the
whole tensor, from offset 0". :class:`LoadPlanner` makes that item directly and leaves every
other case (DTensors, sharded or resharded tensors, bytes) to DCP's own code, item by item.
Where the metadata came from an index (``index.py``), such a tensor is found by its row in the
index's columns, and the plan holds the row instead of the item (:class:`RowItems`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem
from torch.distributed.checkpoint.planner_helpers import _create_read_items

from .._collector import collector_paused
from .._dtensor import dtensor_type
from .index import Entries

_ZEROS: dict[int, torch.Size] = {}
_SCALARS = (int, float, bool, str, bytes, type(None))  # leaves DCP's flattening keeps as they are


def _zeros(ndim: int) -> torch.Size:
    got = _ZEROS.get(ndim)
    if got is None:
        got = _ZEROS[ndim] = torch.Size((0,) * ndim)
    return got


class _ItemFactory:
    """``MetadataIndex`` and ``ReadItem`` objects equal to their constructors' (a template of
    each is made by them once, for the field set of the installed torch), filled in by their
    ``__dict__``: the dataclasses are frozen, and their constructors' ``object.__setattr__`` per
    field cost about 2 us an item."""

    def __init__(self) -> None:
        z = _zeros(1)
        self.index = vars(MetadataIndex("", z, 0))
        self.item = vars(ReadItem(LoadItemType.TENSOR, MetadataIndex("", z, 0), z, MetadataIndex("", z, 0), z, z))

    def whole(self, fqn: str, size: torch.Size) -> ReadItem:
        zeros = _zeros(len(size))
        index = object.__new__(MetadataIndex)
        vars(index).update(self.index, fqn=fqn, offset=zeros)
        item = object.__new__(ReadItem)
        vars(item).update(
            self.item, dest_index=index, dest_offsets=zeros, storage_index=index, storage_offsets=zeros, lengths=size
        )
        return item


_factory: _ItemFactory | None = None


def _item_factory() -> _ItemFactory:
    global _factory
    if _factory is None:
        _factory = _ItemFactory()
    return _factory


class RowItems(Sequence):
    """A local plan's read items where some are whole tensors of an index (``index.py``): an
    int (the entry's row) stands for such an item, made as a ``ReadItem`` (the one DCP's code
    would make) only when asked for; hostreg's reader reads the rows without making them.
    Everything else sees a sequence of ``ReadItem`` in the state dict's order; pickled (to
    other ranks) as a list of them."""

    def __init__(self, index: Any, slots: list[Any]) -> None:
        self.metadata_index = index  # (not "index": Sequence has an index method)
        self.slots = slots  # int: a row of the index read whole; else a ReadItem

    def _item(self, slot: Any) -> ReadItem:
        if type(slot) is int:
            return _item_factory().whole(self.metadata_index.names[slot], torch.Size(self.metadata_index.size(slot)))
        return slot

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._item(s) for s in self.slots[i]]
        return self._item(self.slots[i])

    def __len__(self) -> int:
        return len(self.slots)

    def __iter__(self) -> Iterator[ReadItem]:
        return map(self._item, self.slots)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, RowItems)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> Any:
        return (list, (list(self),))


class _NotFlat(Exception):
    """Raised inside :func:`_flat` where DCP's own flattening must run instead."""


def _walk(node: dict, path: tuple, prefix: str, flat: dict[str, Any], parents: dict[str, tuple]) -> None:
    plain = torch.Tensor
    for k, v in node.items():
        if type(k) is not str:
            raise _NotFlat
        if type(v) is plain:
            if v.is_meta:
                raise _NotFlat  # DCP's set-up makes it a real tensor
        elif isinstance(v, dict):
            if not v:
                raise _NotFlat
            _walk(v, (*path, k), f"{prefix}{k}.", flat, parents)
            continue
        elif type(v) not in _SCALARS:
            raise _NotFlat
        fqn = prefix + k
        if fqn in flat:
            raise _NotFlat  # DCP raises "duplicated flatten key"
        flat[fqn] = v
        parents[fqn] = path


class _Paths(Mapping):
    """DCP's flattening mappings (fqn -> the path of keys to its value), each path made when it
    is looked up (DCP's load looks up only those of bytes items) from the path of its dict,
    which the entries of one dict share: no tuple is made per entry."""

    def __init__(self, parents: dict[str, tuple]) -> None:
        self._parents = parents

    def __getitem__(self, fqn: str) -> tuple:
        parent = self._parents[fqn]
        skip = sum(map(len, parent)) + len(parent)  # the parent's keys and a "." after each
        return (*parent, fqn[skip:])

    def __contains__(self, fqn: object) -> bool:
        return fqn in self._parents

    def __iter__(self) -> Iterator[str]:
        return iter(self._parents)

    def __len__(self) -> int:
        return len(self._parents)


def _flat(state_dict: Any) -> tuple[dict[str, Any], Mapping[str, tuple]] | None:
    """DCP's ``flatten_state_dict`` of a state dict made only of dicts with ``str`` keys, plain
    (``torch.Tensor``, not meta) tensors and scalars: the flattened dict and its mappings
    (:class:`_Paths`), in DCP's order, made in one walk; None for anything else (then DCP's
    own code runs)."""
    flat: dict[str, Any] = {}
    parents: dict[str, tuple] = {}
    try:
        _walk(state_dict, (), "", flat, parents)
    except _NotFlat:
        return None
    return flat, _Paths(parents)


def destinations(planner: Any, items: list[ReadItem]) -> list[torch.Tensor | None] | None:
    """For each read item of a ``DefaultLoadPlanner`` (DCP's, hostreg's ``LoadPlanner`` or a
    subclass), the tensor its ``resolve_tensor`` would give where the item is the whole of a
    plain tensor of the (flattened) state dict, read from the start of the stored tensor: that
    tensor itself; else None (resolve it). None for all where the planner is of another kind
    or changes how tensors are resolved. For hostreg's reader: one dict lookup an item instead
    of DCP's lookup and narrowing."""
    cls = type(planner)
    if (
        not isinstance(planner, DefaultLoadPlanner)
        or cls.resolve_tensor is not DefaultLoadPlanner.resolve_tensor
        or cls.lookup_tensor is not DefaultLoadPlanner.lookup_tensor
        or cls.transform_tensor is not DefaultLoadPlanner.transform_tensor
    ):
        return None
    get, plain, whole = planner.state_dict.get, torch.Tensor, LoadItemType.TENSOR
    out: list[torch.Tensor | None] = []
    for item in items:
        t: Any = get(item.dest_index.fqn)
        ok = (
            type(t) is plain
            and item.type == whole
            and t.shape == item.lengths
            and not any(item.dest_offsets)
            and not any(item.storage_offsets)
        )
        out.append(t if ok else None)
    return out


def _flattened_as_before_2_4(state_dict: Any, missing: set) -> bool:
    """Would DCP's ``DefaultLoadPlanner.create_local_plan`` switch to the flattening of torch
    <= 2.3 for a checkpoint that has keys ``missing`` the (flattened) state dict lacks: does
    that flattening of ``state_dict`` give any of them? (Its own test, torch 2.13
    default_planner.py; True where the installed torch has no such flattening: DCP decides.)"""
    try:
        from torch.distributed.checkpoint import _version
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    except ImportError:
        return True
    _version._derived_version = "2_3"
    try:
        old, _ = flatten_state_dict(state_dict)
    finally:
        _version._derived_version = None
    return not old.keys().isdisjoint(missing)


class LoadPlanner(DefaultLoadPlanner):
    """DCP's ``DefaultLoadPlanner`` with a local plan made without its resharding code where a
    tensor is read whole (see the module docstring); the same read items, the same errors
    (a key missing from the checkpoint: ``RuntimeError``; a size that differs:
    ``ValueError``), the same arguments. ``dcp.load(sd, ..., planner=hostreg.torch.LoadPlanner())``
    with any storage reader (DCP's or hostreg's)."""

    def set_up_planner(self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False) -> None:
        with collector_paused():  # DCP's flattening: as below
            flat = _flat(state_dict) if self.flatten_state_dict else None
            if flat is None:
                super().set_up_planner(state_dict, metadata, is_coordinator)
                return
            # What DCP's set-up does for such a dict: _init_state_dict changes nothing (no meta
            # tensors), _flatten_sharded_tensors copies it (no ShardedTensor), then flattens.
            self.original_state_dict = state_dict
            self.state_dict, self.mappings = flat
            self.metadata = metadata
            self.is_coordinator = is_coordinator

    def create_local_plan(self) -> LoadPlan:
        with collector_paused():  # a few objects per item: no full collection over them all meanwhile
            return self._local_plan()

    def _local_plan(self) -> LoadPlan:
        md = self.metadata
        if md is None:
            raise AssertionError("self.metadata is not None")
        stored = md.state_dict_metadata
        missing = stored.keys() - self.state_dict.keys() if self.flatten_state_dict else None
        if missing and _flattened_as_before_2_4(self.original_state_dict, missing):
            # DCP's test for a checkpoint of torch <= 2.3 (keys it has that the state dict lacks
            # are keys of the old flattening): its own code switches and plans.
            return super().create_local_plan()
        whole = _item_factory().whole
        # From an index (index.py): a plain tensor read whole from an entry stored whole is its
        # row (RowItems), found without making the entry's objects.
        index = stored.index if isinstance(stored, Entries) else None
        row = index.row if index is not None else {}
        items: list[Any] = []
        strict = not self.allow_partial_load
        dt = dtensor_type()
        plain, tsm = torch.Tensor, TensorStorageMetadata
        fqns, objs = list(self.state_dict), list(self.state_dict.values())
        rows = index.whole_rows(fqns, objs) if index is not None else [None] * len(fqns)
        if index is not None and None not in rows:
            return LoadPlan(RowItems(index, rows))  # every one a row (the usual load of a plain state dict)
        for fqn, obj, r in zip(fqns, objs, rows):
            if r is not None:
                items.append(r)
                continue
            if index is not None:
                r = row.get(fqn)
                smd = None if r is None else index.entry(r)
            else:
                smd = stored.get(fqn)
            if smd is None:
                if strict:
                    raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
                continue
            if index is None and type(obj) is plain and type(smd) is tsm:
                # Stored whole in one chunk, read into a plain tensor of its size: the one read
                # item is all of it (an empty tensor has none: DCP's code says so).
                chunks = smd.chunks
                size = obj.shape
                if (
                    len(chunks) == 1
                    and smd.size == size
                    and chunks[0].sizes == size
                    and 0 not in size
                    and not any(chunks[0].offsets)
                ):
                    items.append(whole(fqn, size))
                    continue
            if (
                isinstance(smd, TensorStorageMetadata)
                and getattr(obj, "size", None) is not None
                and smd.size != obj.size()
            ):
                raise ValueError(f"Size mismatch between saved {smd.size} and current: {obj.size()} for {fqn}")
            if dt is not None and isinstance(obj, dt) and obj.device_mesh.get_coordinate() is None:  # type: ignore[attr-defined]
                continue  # a DTensor of a submesh this rank is not in
            items += _create_read_items(fqn, smd, obj)
        return LoadPlan(items if index is None else RowItems(index, items))
