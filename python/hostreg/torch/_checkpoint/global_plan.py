"""DCP's global save plan, made with a few dict copies an item (docs/planning.md).

What ``DefaultSavePlanner`` does with the ranks' local plans the first time it sees a structure
(torch 2.13, ``default_planner.py``: ``_create_global_plan``): it deduplicates the items the
ranks share (``_dedup_save_plans.py``), gives each tensor item the index of its chunk
(``create_default_global_save_plan``: two ``dataclasses.replace`` an item) while it gathers
the ``Metadata``, merges the planner data and validates the chunks. For 65,536 items that is
about 2 s, most of it the dedup's sets and the frozen dataclasses' constructors. Here:

- one rank's plan needs no dedup (DCP's keeps every item of a lone plan, in its order);
- :func:`global_save_plan` makes the same plans and ``Metadata`` as
  ``create_default_global_save_plan``, its new ``MetadataIndex`` and ``WriteItem`` objects
  filled in by their ``__dict__`` from the old ones (every field the installed torch has,
  the chunk index changed), not through their constructors.

Merging and validation stay DCP's own functions. Only hostreg's ``SavePlanner`` uses this.
"""

from __future__ import annotations

import dataclasses
from collections import ChainMap
from typing import Any

from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import SavePlan, WriteItem, WriteItemType


def global_save_plan(all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
    """``create_default_global_save_plan(all_plans)`` of torch's ``default_planner.py``
    (``rewrite_index_hints=True``): each plan with its tensor items' ``index.index`` set to
    their chunk's place in their tensor's ``TensorStorageMetadata.chunks``, and the
    ``Metadata`` of every item. Raises ``AssertionError`` where DCP's does (an fqn planned
    twice other than as shards, a tensor item without tensor data or without a chunk)."""
    md: dict[str, Any] = {}
    new_plans = []
    byte_io, shard = WriteItemType.BYTE_IO, WriteItemType.SHARD
    new = object.__new__
    for plan in all_plans:
        items: list[WriteItem] = []
        for item in plan.items:
            fqn = item.index.fqn
            if item.type != shard and fqn in md:
                raise AssertionError("item.index.fqn not in md")
            if item.type == byte_io:
                md[fqn] = BytesStorageMetadata()
                items.append(item)
                continue
            data = item.tensor_data
            if data is None:
                raise AssertionError("item.tensor_data is not None")
            tmd = md.get(fqn)
            if tmd is None:
                tmd = md[fqn] = TensorStorageMetadata(properties=data.properties, size=data.size, chunks=[])
            index = new(MetadataIndex)
            vars(index).update(vars(item.index), index=len(tmd.chunks))
            rewritten = new(WriteItem)
            vars(rewritten).update(vars(item), index=index)
            items.append(rewritten)
            if data.chunk is None:
                raise AssertionError(f"Cannot create MD for tensor without bounds. FQN: {fqn}")
            tmd.chunks.append(data.chunk)
        new_plans.append(dataclasses.replace(plan, items=items))
    return new_plans, Metadata(md)


def merged_planner_data(plans: list[SavePlan]) -> dict[str, Any]:
    """Every plan's ``planner_data`` in one dict, the first plan's entry winning (as DCP's
    ``ChainMap`` merge)."""
    if len(plans) == 1:
        return dict(plans[0].planner_data)
    return dict(ChainMap(*[p.planner_data for p in plans]))
