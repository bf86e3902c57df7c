"""``Stager``: DCP's ``AsyncStager`` over hostreg arenas, reused across saves.

``dcp.async_save(state_dict, ..., async_stager=hostreg.torch.Stager())`` stages into an arena
(one shared, registered storage) made at the first save; later saves with the same
structure only copy into it. Memory locked and shared-memory objects stay constant across
saves, unlike PyTorch #170163's growth.

A save never overwrites staging memory that an earlier save's writer is still reading
(Megatron-LM PR #2288): each ``stage()`` returns a new dict of new tensor objects over the
buffer's memory, and a buffer counts as busy while any of them is alive. DCP's writer (thread- or process-based) holds it until its
upload finishes, so waiting for the previous save's future frees the buffer. When every
buffer of the right structure is busy, ``stage()`` waits briefly, then uses another buffer
(at most ``max_buffers``), then waits up to ``wait_timeout_s`` and raises.
"""

from __future__ import annotations

import copy
import gc
import threading
import time
import weakref
from typing import Any

import torch

from . import _tree
from ._arena import leaves_on
from ._copy import CopyPlan
from ._errors import StagingError
from ._layout import layout_of
from ._staging import StagedStateDict, stage_layout


class _Buffer:
    def __init__(self, sig: tuple, staged: StagedStateDict) -> None:
        self.sig = sig
        self.staged = staged
        self.plan = CopyPlan(staged.tensors)
        self._issued: list[weakref.ref[torch.Tensor]] = []

    def busy(self) -> bool:
        return any(r() is not None for r in self._issued)

    def moved(self) -> bool:
        """torch moved the storage elsewhere (pickled under the file_system sharing strategy):
        the arena's registration is stale and this buffer must not be used again."""
        return not self.plan.still_valid()

    def issue(self, values: list[Any]) -> dict:
        """A new state dict over this buffer's memory (new tensor objects on its storages, so
        that they say when the last of them is gone), with deep copies of the source's values."""
        fresh = leaves_on(self.staged.storages, self.staged.layout)
        self._issued = [weakref.ref(t) for t in fresh]
        return _tree.unflatten(self.staged.layout.spec, fresh, copy.deepcopy(values))

    def close(self) -> None:
        self.staged.arena.close()


class Stager:
    """DCP ``AsyncStager`` that stages into reusable hostreg arenas.

    Args:
        pin_memory: register the arena (page-lock it) through the active backend.
        share_memory: use torch shared memory, so the background-process checkpointer
            receives the tensors without a copy.
        max_buffers: most arenas kept at once (>= 1); more than one only while an earlier
            save's writer still reads one.
        wait_timeout_s: how long ``stage()`` waits for a busy buffer before raising
            :class:`hostreg.StagingError`.

    ``stage()`` raises :class:`hostreg.StagingError` when memory cannot be reserved or locked,
    ``TypeError`` for state dicts that are not dicts or hold unsupported tensors. Call
    :meth:`close` after the last save (DCP does not close a stager it did not create).
    """

    _synchronize_after_execute: bool = False  # stage() returns only once the copy is done

    def __init__(
        self,
        *,
        pin_memory: bool = True,
        share_memory: bool = True,
        max_buffers: int = 2,
        wait_timeout_s: float = 600.0,
    ) -> None:
        if max_buffers < 1:
            raise ValueError(f"max_buffers must be >= 1, got {max_buffers}")
        self.pin_memory = pin_memory
        self.share_memory = share_memory
        self.max_buffers = max_buffers
        self.wait_timeout_s = wait_timeout_s
        self._pool: list[_Buffer] = []
        self._closed = False
        self._lock = threading.Lock()  # stage() and close() from several threads take turns
        self.arenas_created = 0  #: how many arenas this stager has made (for tests, benchmarks)

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Copy ``state_dict`` into staging memory and return the staged copy."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, not {type(state_dict).__name__}")
        with self._lock:
            if self._closed:
                raise RuntimeError("Stager.stage() after close()")
            layout, tensors, values = layout_of(state_dict)
            buf = self._acquire(layout.key, state_dict)
            buf.plan.copy(tensors)
            return buf.issue(values)

    def synchronize_staging(self) -> None:
        """Nothing to wait for: :meth:`stage` is synchronous."""

    def close(self) -> None:
        """Unregister and release every arena. Idempotent. Tensors still held elsewhere stay
        valid (no longer page-locked) until they are gone."""
        with self._lock:
            for b in self._pool:
                b.close()
            self._pool.clear()
            self._closed = True

    def _acquire(self, sig: tuple, state_dict: dict[str, Any]) -> _Buffer:
        start = time.monotonic()
        collected = False
        while True:
            for b in [b for b in self._pool if b.moved()]:  # never reuse a moved arena
                b.close()
                self._pool.remove(b)
            match = [b for b in self._pool if b.sig == sig]
            for b in match:
                if not b.busy():
                    return b
            waited = time.monotonic() - start
            if match and not collected:
                gc.collect()  # a reference cycle may be all that keeps a finished save's dict
                collected = True
                continue
            if match and waited < 0.2:  # a writer that just finished drops its dict in a moment
                time.sleep(0.005)
                continue
            # Free buffers of another structure are dropped first: their memory is reused.
            for b in [b for b in self._pool if b.sig != sig and not b.busy()]:
                b.close()
                self._pool.remove(b)
            if len(self._pool) < self.max_buffers:
                buf = _Buffer(sig, stage_layout(state_dict, pin_memory=self.pin_memory, share_memory=self.share_memory))
                self._pool.append(buf)
                self.arenas_created += 1
                return buf
            if waited > self.wait_timeout_s:
                raise StagingError(
                    f"all {self.max_buffers} staging buffers are still in use by earlier saves' writers after "
                    f"{self.wait_timeout_s:g} s; wait for the previous save's future, or raise max_buffers"
                )
            time.sleep(0.01)
