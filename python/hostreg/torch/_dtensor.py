"""DTensors (FSDP2, tensor parallel), in and out of staging: staging works on a DTensor's
local shard (:func:`local_of`), remembers what makes it a DTensor (:func:`placement_of`) and
wraps the staged shard again with exactly that (:func:`wrap`), so that DCP plans, saves and
reshards the staged copy as it does PyTorch's own. Everything hostreg knows of DTensors is
here; torch builds without ``torch.distributed`` have none."""

from __future__ import annotations

import functools
from typing import Any

import torch

#: (device mesh, placements, global shape, global strides) of a DTensor.
Placement = tuple


@functools.cache
def dtensor_type() -> type | None:
    """torch's DTensor class where torch.distributed has it, else None."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover -- torch without distributed
        return None
    return DTensor


def local_of(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose bytes are staged: a DTensor's local shard, else t itself."""
    local = getattr(t, "_local_tensor", None)
    return local if local is not None and isinstance(t, dtensor_type() or ()) else t


def placement_of(t: Any, local: torch.Tensor) -> Placement:
    """What makes DTensor ``t`` (whose local shard is ``local``, not ``t``) what it is besides
    its shard's bytes: its mesh, placements, global shape and global strides."""
    return (t.device_mesh, tuple(t.placements), tuple(t.shape), t.stride())


def wrap(local: torch.Tensor, placement: Placement) -> Any:
    """A DTensor over ``local`` with ``placement`` (from :func:`placement_of`), as it was: no
    communication, no check across ranks (the shard is already each rank's own)."""
    from torch.distributed.tensor import DTensor

    mesh, placements, shape, stride = placement
    return DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(shape), stride=stride)
