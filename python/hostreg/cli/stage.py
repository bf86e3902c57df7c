"""``hostreg stage``, the main job: stage a state dict into shared, page-locked CPU memory and
prove it.

:func:`stage_state_dict` stages with hostreg's arena (default) or with PyTorch's own
``_create_cpu_state_dict(share_memory=True, pin_memory=True)`` and ``_copy_state_dict``
through hostreg's drop-in, then checks every value, every registration, and that the
kernel's locked-memory count (``VmLck``) rose by at least the staged bytes.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import _core, _proc
from .. import torch as hostreg_torch
from .._errors import StagingError
from .checkpoint import Progress, SaveError, SaveReport, iter_tensors, same_bytes, save_and_load


@dataclass
class StageReport:
    engine: str  #: "hostreg" (one arena) or "torch" (PyTorch's per-tensor path)
    backend: str  #: hostreg backend that locked the memory
    tensors: int  #: tensors in the state dict
    pinned_tensors: int  #: tensors inside registered memory (torch's path skips 0-d ones)
    registrations: int  #: registrations the staged copy held
    bytes_staged: int  #: bytes of the registered tensors
    bytes_locked: int  #: rise of VmLck while the staged copy was alive, bytes
    create_s: float  #: seconds to create the staged copy (allocate, populate, register)
    copy_s: float  #: seconds to copy the values into it
    released: bool  #: every registration was undone after del + gc.collect()
    saved: SaveReport | None = None  #: the checkpoint round trip, when asked for

    @property
    def copy_gib_per_s(self) -> float:
        return self.bytes_staged / 2**30 / self.copy_s if self.copy_s > 0 else float("inf")


ENGINES = ("hostreg", "torch")


def _shared_arena(t: torch.Tensor) -> bool:
    """Is t inside one of hostreg's shared-memory arenas? (Its storage is its own: torch's
    is_shared() does not know it is shared memory.)"""
    from ..torch import _sharing

    buf = _sharing.staging_buffer_of(t)
    return buf is not None and buf.fd >= 0


def _verify(
    source: dict[str, Any], staged: dict[str, Any], engine: str, progress: Progress
) -> tuple[list[str], int, int]:
    """Compare the staged copy with its source; returns (problems, pinned tensors, pinned bytes).

    Pinned bytes are the unique bytes of the pinned tensors (tied weights and views counted
    once). Pinned tensors: PyTorch's path registers every tensor except 0-d and empty ones, each as
    its own registration; hostreg's registers every non-empty tensor inside one arena (one
    registration, or consecutive chunks where a runtime or HOSTREG_MAX_REGISTRATION caps one).
    """
    problems: list[str] = []
    src = dict(iter_tensors(source))
    dst = dict(iter_tensors(staged))
    if src.keys() != dst.keys():
        problems.append("the staged copy has other keys than the source")
    total = sum(t.numel() * t.element_size() for t in src.values())
    done = pinned = 0
    spans: list[tuple[int, int]] = []  # [start, end) of every staged tensor's bytes
    for key, s in src.items():
        d = dst.get(key)
        if d is None:
            continue
        nbytes = d.numel() * d.element_size()
        done += nbytes
        progress("verify", done, total)
        if not same_bytes(s, d):
            problems.append(f"{key}: staged values differ from the source")
        if engine == "torch" and d.dim() == 0:
            continue  # PyTorch's path makes 0-d tensors plain, neither shared nor pinned
        in_shared_memory = d.is_shared() if engine == "torch" else _shared_arena(d)
        if not in_shared_memory and (engine == "torch" or nbytes):
            problems.append(f"{key}: staged tensor is not in shared memory")
        if nbytes == 0:
            continue
        pinned += 1
        spans.append((d.data_ptr(), d.data_ptr() + nbytes))
        reg = _core.registration(d.data_ptr())
        if engine == "torch":
            whole = reg is not None and reg.base == d.data_ptr() and reg.nbytes == nbytes
        else:  # inside the arena's registrations: one, or consecutive chunks where a cap split it
            end = d.data_ptr() + nbytes
            while reg is not None and reg.base + reg.nbytes < end:
                nxt = _core.registration(reg.base + reg.nbytes)
                reg = nxt if nxt is not None and nxt.base == reg.base + reg.nbytes else None
            whole = reg is not None
        if not whole:
            problems.append(f"{key}: staged tensor is not registered as a whole")
    return problems, pinned, _union(spans)


def _union(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by the [start, end) spans, each byte once (tied weights and views share
    their bytes)."""
    covered = end = 0
    for a, b in sorted(spans):
        if b > end:
            covered += b - max(a, end)
            end = b
    return covered


def _create_and_copy(state_dict: dict[str, Any], engine: str, progress: Progress) -> tuple[Any, float, float]:
    """The staged copy, seconds to create it, seconds to copy into it."""
    total = sum(t.numel() * t.element_size() for _, t in iter_tensors(state_dict))
    progress("create", 0, total)
    t0 = time.perf_counter()
    if engine == "torch":
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        hostreg_torch.install()
        try:
            staged = _create_cpu_state_dict(state_dict, pin_memory=True, share_memory=True)
        except RuntimeError as e:
            gc.collect()  # drop the tensors already made; their finalizers unregister them
            # PyTorch's message carries only the code; hostreg's reason is in last_error().
            err = _core.last_error()
            reason = f"\nhostreg: {err.code}: {err.message}" if "cudaError" in str(e) else ""
            raise StagingError(f"{e}{reason}") from e
        progress("create", total, total)
        t1 = time.perf_counter()
        _copy_state_dict(state_dict, staged)
        progress("copy", total, total)
    else:
        from ..torch._copy import CopyPlan
        from ..torch._state_dict import allocate_staged_copy

        staged_copy = allocate_staged_copy(state_dict)
        progress("create", total, total)
        t1 = time.perf_counter()
        src = [t for _, t in iter_tensors(state_dict)]
        # Copied in about 20 steps by bytes, so a long staging shows its progress.
        step, start, done, acc = max(total // 20, 1), 0, 0, 0
        for i, t in enumerate(src):
            acc += t.numel() * t.element_size()
            if acc >= step or i == len(src) - 1:
                CopyPlan(staged_copy.tensors[start : i + 1]).copy(src[start : i + 1])
                done += acc
                progress("copy", done, total)
                start, acc = i + 1, 0
        staged = staged_copy.state_dict
        del staged_copy
    return staged, t1 - t0, time.perf_counter() - t1


def stage_state_dict(
    state_dict: dict[str, Any],
    engine: str = "hostreg",
    progress: Progress | None = None,
    save_to: str | Path | None = None,
) -> StageReport:
    """Stage ``state_dict`` into shared, page-locked memory, verify it, release it, report.

    ``engine="hostreg"``: one arena for the whole state dict (:mod:`hostreg.torch` staging).
    ``engine="torch"``: PyTorch's own ``_create_cpu_state_dict(share_memory=True,
    pin_memory=True)`` and ``_copy_state_dict`` through the drop-in (installs it).

    Checks every value (bytes), that every staged tensor is shared and registered, that
    ``VmLck`` rose by at least the staged bytes, and that every registration is gone after
    release. With ``save_to``, the staged copy is also saved there as a DCP checkpoint and
    loaded back (:func:`save_and_load`; its report in ``saved``) before it is released. Raises :class:`StagingError` when staging fails (the message names the cause,
    e.g. ``RLIMIT_MEMLOCK`` or ``/dev/shm``) or a check fails; ``ValueError`` for an unknown
    engine.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    report = progress or (lambda phase, done, total: None)
    before_regs = _core.stats().registrations
    before_locked = _proc.locked_bytes()

    try:
        staged, create_s, copy_s = _create_and_copy(state_dict, engine, report)
    except (TypeError, RuntimeError) as e:  # tensors it cannot stage (sparse, nested, ...)
        if isinstance(e, StagingError):
            raise
        gc.collect()
        raise StagingError(f"cannot stage this state dict with the {engine} engine: {type(e).__name__}: {e}") from e
    registrations = _core.stats().registrations - before_regs
    problems, pinned, staged_bytes = _verify(state_dict, staged, engine, report)
    locked = _proc.locked_bytes() - before_locked
    if locked < staged_bytes:
        problems.append(f"VmLck rose by {locked} bytes, less than the {staged_bytes} bytes staged")
    saved = None
    failed: SaveError | None = None
    try:
        if save_to is not None and not problems:
            saved = save_and_load(state_dict, staged, save_to, report)
    except SaveError as e:  # raised below, without the frames that hold the staged copy
        failed = SaveError(str(e))
    finally:
        del staged
        gc.collect()
    if failed is not None:
        raise failed

    released = _core.stats().registrations == before_regs
    if not released:
        problems.append("registrations were still live after the staged copy was released")
    if problems:
        raise StagingError("staging verification failed:\n  " + "\n  ".join(problems[:20]))
    return StageReport(
        engine=engine,
        backend=_core.backend(),
        tensors=sum(1 for _ in iter_tensors(state_dict)),
        pinned_tensors=pinned,
        registrations=registrations,
        bytes_staged=staged_bytes,
        bytes_locked=locked,
        create_s=create_s,
        copy_s=copy_s,
        released=released,
        saved=saved,
    )
