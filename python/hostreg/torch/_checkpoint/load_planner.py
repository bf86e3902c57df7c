"""DCP load planner whose plan costs a few microseconds an item (docs/planning.md).

DCP's ``DefaultLoadPlanner`` makes each tensor's read items with its resharding code: the
destination's chunk list, a sweep over the saved chunks, the overlap of each pair, and a
``ReadItem`` from those (about 90 us an item in torch 2.13: 6 s for 65,536 tensors). Most
tensors of most loads need none of it: the checkpoint holds the tensor in one chunk that
covers it, and the destination is a plain tensor of that size, so the one read item is "the
whole tensor, from offset 0". :class:`LoadPlanner` makes that item directly and leaves every
other case (DTensors, sharded or resharded tensors, bytes) to DCP's own code, item by item.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem
from torch.distributed.checkpoint.planner_helpers import _create_read_items

from .._collector import collector_paused
from .._dtensor import dtensor_type

_ZEROS: dict[int, torch.Size] = {}


def _zeros(ndim: int) -> torch.Size:
    got = _ZEROS.get(ndim)
    if got is None:
        got = _ZEROS[ndim] = torch.Size((0,) * ndim)
    return got


def _whole(fqn: str, md: Any, obj: Any) -> ReadItem | None:
    """The one read item of a plain tensor ``obj`` stored whole in one chunk, else None."""
    if type(obj) is not torch.Tensor or type(md) is not TensorStorageMetadata or len(md.chunks) != 1:
        return None
    chunk = md.chunks[0]
    size = obj.size()
    if chunk.sizes != size or md.size != size or any(chunk.offsets) or 0 in size:
        return None  # (an empty tensor has no read item: DCP's code says so)
    zeros = _zeros(len(size))
    index = MetadataIndex(fqn, zeros, 0)
    return ReadItem(LoadItemType.TENSOR, index, zeros, index, zeros, size)


class LoadPlanner(DefaultLoadPlanner):
    """DCP's ``DefaultLoadPlanner`` with a local plan made without its resharding code where a
    tensor is read whole (see the module docstring); the same read items, the same errors
    (a key missing from the checkpoint: ``RuntimeError``; a size that differs:
    ``ValueError``), the same arguments. ``dcp.load(sd, ..., planner=hostreg.torch.LoadPlanner())``
    with any storage reader (DCP's or hostreg's)."""

    def destinations(self, items: list[ReadItem]) -> list[torch.Tensor | None] | None:
        """For each read item, the tensor :meth:`resolve_tensor` would give where the item is
        the whole of a plain tensor of the (flattened) state dict: that tensor itself; else
        None (resolve it). None for all where a subclass changes how tensors are resolved.
        For hostreg's reader: one dict lookup an item instead of DCP's lookup and narrowing."""
        cls = type(self)
        if (
            cls.resolve_tensor is not DefaultLoadPlanner.resolve_tensor
            or cls.lookup_tensor is not DefaultLoadPlanner.lookup_tensor
            or cls.transform_tensor is not DefaultLoadPlanner.transform_tensor
        ):
            return None
        get, plain, whole = self.state_dict.get, torch.Tensor, LoadItemType.TENSOR
        out: list[torch.Tensor | None] = []
        for item in items:
            t = get(item.dest_index.fqn)
            ok = type(t) is plain and item.type == whole and t.shape == item.lengths and not any(item.dest_offsets)
            out.append(t if ok else None)
        return out

    def set_up_planner(self, *args: Any, **kwargs: Any) -> None:
        with collector_paused():  # DCP's flattening: as below
            super().set_up_planner(*args, **kwargs)

    def create_local_plan(self) -> LoadPlan:
        with collector_paused():  # a few objects per item: no full collection over them all meanwhile
            return self._local_plan()

    def _local_plan(self) -> LoadPlan:
        md = self.metadata
        if md is None:
            raise AssertionError("self.metadata is not None")
        stored = md.state_dict_metadata
        if self.flatten_state_dict and not stored.keys() >= self.state_dict.keys():
            return super().create_local_plan()  # DCP's handling of checkpoints from before torch 2.4
        items: list[ReadItem] = []
        strict = not self.allow_partial_load
        dt = dtensor_type()
        for fqn, obj in self.state_dict.items():
            smd = stored.get(fqn)
            if smd is None:
                if strict:
                    raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")
                continue
            one = _whole(fqn, smd, obj)
            if one is not None:
                items.append(one)
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
        return LoadPlan(items)
