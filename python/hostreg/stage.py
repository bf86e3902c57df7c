"""The main job: stage a state dict into shared, page-locked CPU memory and prove it.

:func:`stage_with_torch` runs PyTorch's own ``_create_cpu_state_dict(share_memory=True,
pin_memory=True)`` and ``_copy_state_dict`` with hostreg's drop-in installed, then checks
every value, every registration, and that the kernel's locked-memory count (``VmLck``)
rose by at least the staged bytes.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from . import _core, _proc
from ._errors import StagingError
from . import torch as hostreg_torch


@dataclass
class StageReport:
    backend: str  #: hostreg backend that locked the memory
    tensors: int  #: tensors in the state dict
    pinned_tensors: int  #: tensors registered (0-d and empty ones are not, as in PyTorch)
    bytes_staged: int  #: bytes of the registered tensors
    bytes_locked: int  #: rise of VmLck while the staged copy was alive, bytes
    create_s: float  #: seconds in _create_cpu_state_dict
    copy_s: float  #: seconds in _copy_state_dict
    released: bool  #: every registration was undone after del + gc.collect()

    @property
    def copy_gib_per_s(self) -> float:
        return self.bytes_staged / 2**30 / self.copy_s if self.copy_s > 0 else float("inf")


def iter_tensors(obj: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(dotted key, tensor) for every tensor in a nested dict/list/tuple state dict."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from iter_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from iter_tensors(v, f"{prefix}.{i}" if prefix else str(i))


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a state dict from a ``.safetensors`` file or a ``torch.save`` file (``.pt``,
    ``.pth``, ``.bin``; loaded with ``weights_only=True``, so only tensors and plain
    containers, never pickled code such as a whole ``nn.Module``).

    Raises ``StagingError`` naming the file for a missing or unreadable file, an unknown
    suffix, a corrupt file, one that holds no tensors, or a missing ``safetensors`` package.
    """
    p = Path(path)
    if not p.is_file():
        raise StagingError(f"checkpoint {p} does not exist or is not a file")
    if p.suffix not in (".safetensors", ".pt", ".pth", ".bin"):
        raise StagingError(f"checkpoint {p}: unknown format {p.suffix!r} (use .safetensors, .pt, .pth or .bin)")
    if p.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise StagingError("reading .safetensors needs the safetensors package: pip install safetensors") from None
    try:
        if p.suffix == ".safetensors":
            sd: Any = load_file(str(p), device="cpu")
        else:
            sd = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- any reader failure means "cannot read this file"
        hint = " (a whole nn.Module cannot be loaded safely: save its state_dict())" if "Unsupported global" in str(e) else ""
        raise StagingError(f"cannot read checkpoint {p}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{hint}") from e
    if not isinstance(sd, dict) or not any(True for _ in iter_tensors(sd)):
        raise StagingError(f"checkpoint {p} holds no state dict of tensors")
    return sd


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (so NaNs compare equal, unlike ``torch.equal``)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _pinned(t: torch.Tensor) -> bool:
    # PyTorch's _create_cpu_state_dict pins every tensor except 0-d and empty ones.
    return t.dim() > 0 and t.numel() > 0


def _verify(source: dict[str, Any], staged: dict[str, Any]) -> tuple[list[str], int, int]:
    """Compare the staged copy with its source; returns (problems, pinned tensors, pinned bytes)."""
    problems: list[str] = []
    src = dict(iter_tensors(source))
    dst = dict(iter_tensors(staged))
    if src.keys() != dst.keys():
        problems.append("the staged copy has other keys than the source")
    pinned = staged_bytes = 0
    for key, s in src.items():
        d = dst.get(key)
        if d is None:
            continue
        if not same_bytes(s, d):
            problems.append(f"{key}: staged values differ from the source")
        if _pinned(d):
            pinned += 1
            nbytes = d.numel() * d.element_size()
            staged_bytes += nbytes
            reg = _core.registration(d.data_ptr())
            if not d.is_shared():
                problems.append(f"{key}: staged tensor is not in shared memory")
            if reg is None or reg.base != d.data_ptr() or reg.nbytes != nbytes:
                problems.append(f"{key}: staged tensor is not registered as a whole")
    return problems, pinned, staged_bytes


def stage_with_torch(state_dict: dict[str, Any]) -> StageReport:
    """Stage ``state_dict`` with PyTorch's own shared+pinned path through hostreg.

    Installs :func:`hostreg.torch.install`. Returns the report after the staged copy has
    been verified and released. Raises :class:`StagingError` when staging fails (the
    message names the cause, e.g. ``RLIMIT_MEMLOCK``) or when a check fails.
    """
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    hostreg_torch.install()
    before_regs = _core.stats().registrations
    before_locked = _proc.locked_bytes()

    t0 = time.perf_counter()
    try:
        staged = _create_cpu_state_dict(state_dict, pin_memory=True, share_memory=True)
    except RuntimeError as e:
        gc.collect()  # drop the tensors already made; their finalizers unregister them
        # PyTorch's message carries only the code; hostreg's reason is in last_error().
        reason = f"\nhostreg: {_core.last_error().code}: {_core.last_error().message}" if "cudaError" in str(e) else ""
        raise StagingError(f"{e}{reason}") from e
    t1 = time.perf_counter()
    _copy_state_dict(state_dict, staged)
    t2 = time.perf_counter()

    problems, pinned, staged_bytes = _verify(state_dict, staged)
    locked = _proc.locked_bytes() - before_locked
    if locked < staged_bytes:
        problems.append(f"VmLck rose by {locked} bytes, less than the {staged_bytes} bytes staged")

    del staged
    gc.collect()
    released = _core.stats().registrations == before_regs
    if not released:
        problems.append("registrations were still live after the staged copy was released")
    if problems:
        raise StagingError("staging verification failed:\n  " + "\n  ".join(problems[:20]))
    return StageReport(
        backend=_core.backend(),
        tensors=sum(1 for _ in iter_tensors(state_dict)),
        pinned_tensors=pinned,
        bytes_staged=staged_bytes,
        bytes_locked=locked,
        create_s=t1 - t0,
        copy_s=t2 - t1,
        released=released,
    )
