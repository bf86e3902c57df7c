"""The staging buffers of a :class:`~hostreg.torch.Stager` (``_stager.py``): a pool of slots,
each a staged copy (arena, layout, leaves) that saves of one layout are staged into, handed
out as new tensor objects that say when the last of them is gone."""

from __future__ import annotations

import copy
import gc
import time
import weakref
from itertools import repeat
from operator import is_not
from typing import Any, Callable

import torch

from .._errors import HostregError, StagingError
from . import _issued, _tree
from ._arena import leaves_on
from ._copy import CopyPlan
from ._layout import Prepared
from ._state_dict import StagedCopy, allocate_staged_copy


class _Slot:
    """One slot of a Stager's pool: a staged copy (its arena, layout and leaves), the copy plan
    into its leaves, and the tensors last handed out over it. ``key`` is its layout's
    (``Layout.key``): a state dict whose layout has the same key is staged into this slot."""

    def __init__(self, key: tuple, staged: StagedCopy) -> None:
        self.key = key
        self.staged = staged
        self.plan = CopyPlan(staged.tensors, grouping=staged.layout.grouping.as_destination())
        self._ptrs = list(map(torch.UntypedStorage.data_ptr, staged.storages))
        self._issued: list[weakref.ref[torch.Tensor]] = []
        # Plain leaves are handed out as detach()es of the buffer's own (a new tensor object
        # and TensorImpl over the same storage, offset, shape and strides, made in C++: about
        # a quarter of what building one with set_() costs); DTensor leaves are wrapped anew.
        self._plain = all(type(t) is torch.Tensor for t in staged.tensors)
        self.plan_columns: Any = None  # what hostreg's save planner reads of the tensors handed out (_issued.py)

    def busy(self) -> bool:
        return any(map(is_not, map(weakref.ref.__call__, self._issued), repeat(None)))

    def moved(self) -> bool:
        """torch moved the storage elsewhere (pickled under the file_system sharing strategy):
        the arena's registration is stale and this buffer must not be used again. The span
        storages are the only way to the plan's destinations (the leaves it copies into are
        this buffer's own, never handed out; the tensors :meth:`issue` hands out are new
        objects over the same storages), so a storage that still starts where it did means
        the plan still holds: one address per span, not a measure of every leaf."""
        return list(map(torch.UntypedStorage.data_ptr, self.staged.storages)) != self._ptrs

    def issue(self, values: list[Any]) -> dict:
        """A new state dict over this buffer's memory (new tensor objects on its storages, so
        that they say when the last of them is gone), with deep copies of the source's values."""
        if self._plain:
            with torch.no_grad():  # no autograd view record to make: a quarter of detach()'s cost
                fresh = list(map(torch.Tensor.detach, self.staged.tensors))
        else:
            fresh = leaves_on(self.staged.storages, self.staged.layout)
        self._issued = list(map(weakref.ref, fresh))
        _issued.note(self.staged.layout.spec, self._issued, self)
        return _tree.unflatten(self.staged.layout.spec, fresh, copy.deepcopy(values))

    def close(self) -> None:
        self.staged.arena.close()


class SlotPool:
    """A Stager's slots, at most ``max_buffers`` of them (given with each :meth:`acquire`, as
    the Stager's settings are). Not thread-safe: the Stager holds its pool lock around every
    call."""

    def __init__(self) -> None:
        self.slots: list[_Slot] = []
        self.created = 0  # slots (arenas) made so far

    def acquire(
        self,
        prepared: Prepared,
        *,
        max_buffers: int,
        wait_timeout_s: float,
        pin_memory: bool,
        share_memory: bool,
        closed: Callable[[], bool],
    ) -> _Slot:
        """A free slot for ``prepared``'s layout: one of that layout not in use, else (after a
        short wait for a writer that is finishing, and a collection) a new one, freeing slots of
        other layouts first; with ``max_buffers`` in use, waits up to ``wait_timeout_s``, then
        StagingError. HostregError when ``closed()`` turns true while it waits."""
        key = prepared[0].key
        start = time.monotonic()
        collected = False
        while True:
            for b in [b for b in self.slots if b.moved()]:  # never reuse a moved arena
                b.close()
                self.slots.remove(b)
            match = [b for b in self.slots if b.key == key]
            for b in match:
                if not b.busy():
                    return b
            waited = time.monotonic() - start
            if match and not collected:
                gc.collect()  # a reference cycle may be all that keeps a finished save's dict
                collected = True
                continue
            # A writer that just finished drops its dict in a moment: DCP's thread executor
            # resolves the save's future before its worker thread releases the work item that
            # holds the staged dict, and on a loaded machine that thread may wait for a core
            # (0.2 s was once too short on a 2-core machine with 2 test workers and an
            # emulated torch busy).
            if match and waited < 0.5:
                time.sleep(0.005)
                continue
            # Free buffers of another structure are dropped first: their memory is reused.
            for b in [b for b in self.slots if b.key != key and not b.busy()]:
                b.close()
                self.slots.remove(b)
            if len(self.slots) < max_buffers:
                staged = allocate_staged_copy(None, pin_memory=pin_memory, share_memory=share_memory, prepared=prepared)
                buf = _Slot(key, staged)
                self.slots.append(buf)
                self.created += 1
                return buf
            if closed():
                raise HostregError("Stager.close() while this staging waited for a free buffer")
            if waited > wait_timeout_s:
                raise StagingError(
                    f"all {max_buffers} staging buffers are still in use by earlier saves' writers after "
                    f"{wait_timeout_s:g} s; wait for the previous save's future, or raise max_buffers"
                )
            time.sleep(0.01)

    def close(self) -> None:
        """Releases every slot's arena."""
        for b in self.slots:
            b.close()
        self.slots.clear()
