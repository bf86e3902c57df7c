"""hostreg for PyTorch: the ``torch.cuda.cudart()`` drop-in and fast state-dict staging.

- The drop-in (:func:`install`, :func:`uninstall`, :func:`is_installed`; ``hostreg/_dropin.py``)
  makes ``torch.cuda.cudart()`` work where CUDA is absent, with real page-locking.
- Staging (:func:`create_cpu_state_dict`, :func:`copy_state_dict`, :class:`Stager`,
  :class:`Arena`; ``_state_dict.py``, ``_stager.py`` in this package) puts a whole state dict
  in one shared, registered arena.
- In-place pinning (:func:`pin_`, :func:`unpin_`, :func:`pinned`; ``_pin.py``) page-locks
  the memory any CPU tensor already has, where ``Tensor.pin_memory()`` copies.
- Checkpoints (:class:`FileSystemWriter`, :class:`FileSystemReader`; the ``_checkpoint`` package)
  write and read DCP's own format at the disk's speed (``O_DIRECT`` from the arena);
  :class:`SavePlanner` plans a save once per state-dict structure (:func:`clear_plan_cache`),
  :class:`LoadPlanner` plans a load without DCP's per-item resharding code where it needs none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._dropin import install, is_installed, uninstall
from ._pin import PinError, is_pinned_by_hostreg, pin_, pinned, unpin_
from ._stager import Stager
from ._state_dict import ALIGNMENT, Arena, copy_state_dict, create_cpu_state_dict

__all__ = [
    "ALIGNMENT",
    "Arena",
    "CorruptCheckpointError",
    "UntrustedMetadataError",
    "clear_plan_cache",
    "FileSystemReader",
    "FileSystemWriter",
    "LoadPlanner",
    "PinError",
    "SavePlanner",
    "Stager",
    "copy_state_dict",
    "create_cpu_state_dict",
    "install",
    "is_installed",
    "is_pinned_by_hostreg",
    "pin_",
    "pinned",
    "uninstall",
    "unpin_",
]

if TYPE_CHECKING:
    from ._checkpoint import (
        CorruptCheckpointError,
        FileSystemReader,
        FileSystemWriter,
        LoadPlanner,
        SavePlanner,
        UntrustedMetadataError,
        clear_plan_cache,
    )


def __dir__() -> list[str]:
    """What ``__all__`` names (the checkpoint package's names too, imported only when used)."""
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    # The checkpoint writer and reader import torch.distributed.checkpoint (about 0.5 s): only
    # when asked for, so that the drop-in and staging start as fast as before.
    if name in __all__:  # the names of __all__ not defined above: the checkpoint package's
        from . import _checkpoint

        return getattr(_checkpoint, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
