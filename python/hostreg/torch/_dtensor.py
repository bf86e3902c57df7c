"""DTensors (FSDP2, tensor parallel), in and out of staging: staging works on a DTensor's
local shard (:func:`local_of`), remembers what makes it a DTensor (:func:`placement_of`) and
wraps the staged shard again with exactly that (:func:`wrap`), so that DCP plans, saves and
reshards the staged copy as it does PyTorch's own. Everything hostreg knows of DTensors is
here; torch builds without ``torch.distributed`` have none."""

from __future__ import annotations

import sys
from typing import Any

import torch

#: (device mesh, placements, global shape, global strides) of a DTensor.
Placement = tuple

# The modules that define DTensor: torch >= 2.5 (public as torch.distributed.tensor.DTensor),
# and torch 2.4 (torch.distributed._tensor.DTensor).
_DEFINED_IN = ("torch.distributed.tensor._api", "torch.distributed._tensor.api")
_dtensor: type | None = None


def dtensor_type() -> type | None:
    """torch's DTensor class once the program has imported it, else None.

    No DTensor exists before its class does, so a program that never imported it has none to
    stage; importing it here would add about 0.4 s to a first staging (DTensor's import brings
    sympy with it), and torch builds without ``torch.distributed`` have none at all."""
    global _dtensor
    if _dtensor is None:
        for name in _DEFINED_IN:
            _dtensor = getattr(sys.modules.get(name), "DTensor", None)
            if _dtensor is not None:
                break
    return _dtensor


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
    dtensor = dtensor_type()  # not None: the DTensor this placement was taken from exists
    mesh, placements, shape, stride = placement
    return dtensor.from_local(  # type: ignore[union-attr]
        local, mesh, placements, run_check=False, shape=torch.Size(shape), stride=stride
    )
