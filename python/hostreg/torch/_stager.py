"""``Stager``: DCP's ``AsyncStager`` over hostreg arenas, reused across saves.

``dcp.async_save(state_dict, ..., async_stager=hostreg.torch.Stager())`` stages into an arena
(one shared, registered storage) made at the first save; later saves with the same
structure only copy into it, so memory locked and shared-memory objects stay constant across
saves (PyTorch's DefaultStager grows them; ``docs/staging.md``).

A save never overwrites staging memory that an earlier save's writer is still reading: each
``stage()`` returns a new dict of new tensor objects over the buffer's memory, and a buffer
is busy while any of them is alive. DCP's writer (thread- or process-based) holds them until
its upload finishes, so waiting for the previous save's future frees the buffer. When every
buffer of the right structure is busy, ``stage()`` waits briefly, then uses another buffer
(at most ``max_buffers``), then waits up to ``wait_timeout_s`` and raises.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from .. import _core
from .._errors import HostregError, StagingError
from . import _tree
from ._arena import Arena
from ._async import accelerator_available, async_save_takes_futures, settle
from ._collector import collector_paused
from ._layout import Flat, Prepared, check_flat, flatten_checked, layout_of, nbytes_of
from ._slots import SlotPool
from ._sources import source_key

_CHANGED = (
    "a source tensor's storage was freed, resized or replaced while it was being staged: nothing was "
    "staged; leave the sources alone until the staging future is done, and stage again"
)


def _changed(tensors: list, key: tuple) -> bool:
    """Do ``tensors`` no longer lie where, or look as, ``key`` (their :func:`source_key` at
    the stage's start) says?"""
    try:
        return source_key(tensors) != key
    except Exception:  # no address or sizes any more
        return True


class Stager:
    """DCP ``AsyncStager`` that stages into reusable hostreg arenas.

    Args:
        options: DCP's ``StagingOptions`` (torch >= 2.9), as ``DefaultStager`` takes it, in
            place of the four keywords below: ``use_pinned_memory`` is ``pin_memory``,
            ``use_shared_memory`` ``share_memory``, ``use_async_staging`` ``async_staging``;
            ``use_non_blocking_copy`` is accepted and needs no accelerator here: copies from an
            accelerator are non-blocking on a side stream in async mode anyway, and host
            copies are the C core's. So ``Stager(StagingOptions(True, True, True, True))``
            works on a host without CUDA, where ``DefaultStager``'s raises ``AssertionError``
            ("Non-blocking copy requires that the current accelerator is available"). Given
            with any of the four keywords: ``TypeError``.
        pin_memory: register the arena (page-lock it) through the active backend.
        share_memory: use torch shared memory, so the background-process checkpointer
            receives the tensors without a copy.
        max_buffers: most arenas kept at once (>= 1); more than one only while an earlier
            save's writer still reads one.
        wait_timeout_s: how long ``stage()`` waits for a busy buffer before raising
            :class:`hostreg.StagingError`.
        async_staging: ``stage()`` returns a ``Future`` of the staged dict at once; the
            staging runs in one background thread (needs a torch whose ``dcp.async_save``
            takes a future, the ones with ``AsyncSaveResponse``; else ``ValueError``). From an
            accelerator the copies are non-blocking, on a side stream made here, after the work
            queued on the caller's current stream when ``stage()`` was called; the future
            resolves once they have landed.

    When the caller may modify the source again: in sync mode, once ``stage()`` (or
    ``dcp.async_save``) has returned; in async mode, once the future has resolved
    (``AsyncSaveResponse.staging_completion.result()``, or :meth:`synchronize_staging`).
    A change made before then may or may not be in the checkpoint, tensor by tensor.

    The constructor raises :class:`hostreg.StagingError` when the staging thread cannot be
    started. ``stage()`` raises :class:`hostreg.StagingError` when memory cannot be reserved or
    locked, ``TypeError`` for state dicts that are not dicts or hold unsupported tensors
    (naming the entry), :class:`hostreg.HostregError` (a ``RuntimeError``) after :meth:`close`.
    In async mode these are raised by ``stage()`` itself wherever they can be known without the
    staging thread: the argument,
    every tensor's kind, and, for the stager's first arena, the room for it (the shared-memory
    directory's free space, ``RLIMIT_MEMLOCK`` where the backend locks pages with ``mlock``).
    That matters: torch's ``dcp.async_save`` reports a staging future that has already failed
    when it looks as a success on ``staging_completion`` (torch 2.13
    ``torch/distributed/checkpoint/state_dict_saver.py``, ``async_save``: ``if not
    staging_future.done(): ... else: return_staging_future.set_result(None)``). The rest (a
    later arena's memory, a wait for a busy buffer, the copy) is set on the future and
    re-raised by :meth:`synchronize_staging`; ``stage()`` never waits for the staging thread.
    Call :meth:`close` after the last save (DCP does not close a stager it did not create),
    or use the stager as a context manager (``with Stager(...) as stager:``), which closes it
    on leaving.
    """

    _synchronize_after_execute: bool = False  # sync: stage() returns once the copy is done

    def __init__(
        self,
        options: Any = None,
        *,
        pin_memory: bool | None = None,
        share_memory: bool | None = None,
        max_buffers: int = 2,
        wait_timeout_s: float = 600.0,
        async_staging: bool | None = None,
    ) -> None:
        if options is not None:
            given = [
                k
                for k, v in (
                    ("pin_memory", pin_memory),
                    ("share_memory", share_memory),
                    ("async_staging", async_staging),
                )
                if v is not None
            ]
            if given:
                raise TypeError(f"Stager takes StagingOptions or {', '.join(given)}, not both")
            try:
                pin_memory = bool(options.use_pinned_memory)
                share_memory = bool(options.use_shared_memory)
                async_staging = bool(options.use_async_staging)
                bool(options.use_non_blocking_copy)
            except AttributeError:
                raise TypeError(
                    f"Stager's first argument is DCP's StagingOptions, not {type(options).__name__}"
                ) from None
        pin_memory = True if pin_memory is None else pin_memory
        share_memory = True if share_memory is None else share_memory
        async_staging = False if async_staging is None else async_staging
        for name, value in (
            ("pin_memory", pin_memory),
            ("share_memory", share_memory),
            ("async_staging", async_staging),
        ):
            if type(value) is not bool:
                raise TypeError(f"Stager({name}=...) takes a bool, not {value!r}")
        if type(max_buffers) is not int:
            raise TypeError(f"Stager(max_buffers=...) takes an int, not {max_buffers!r}")
        if type(wait_timeout_s) not in (int, float) or not wait_timeout_s >= 0 or wait_timeout_s == float("inf"):
            raise ValueError(
                f"Stager(wait_timeout_s=...) takes a finite number of seconds >= 0, not {wait_timeout_s!r}"
            )
        if max_buffers < 1:
            raise ValueError(f"max_buffers must be >= 1, got {max_buffers}")
        if async_staging and not async_save_takes_futures():
            raise ValueError(
                f"async_staging needs a torch whose dcp.async_save takes a Future (AsyncSaveResponse); torch {torch.__version__} has none"
            )
        self.pin_memory = pin_memory
        self.share_memory = share_memory
        self.max_buffers = max_buffers
        self.wait_timeout_s = wait_timeout_s
        self._pool = SlotPool()
        self._closed = False  # no new stage()
        self._released = False  # the arenas are gone
        # Two locks, so that an async stage() never waits for the worker: _submit guards the
        # executor and the last future (held for microseconds by stage() and close()); _pool
        # guards the buffers (held by whoever stages: the worker in async mode, the caller in
        # sync mode, for the whole wait and copy).
        self._submit = threading.Lock()
        self._pool_lock = threading.Lock()
        self._worker: int | None = None  # the staging thread's ident (async mode)
        self._last_layout: tuple | None = None  # (spec, source_key, Layout) of the last stage (pool lock)
        self.async_staging = async_staging
        self._executor: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._stream: Any = None
        if async_staging:
            # The thread starts now, not in the first stage(): starting it there would block
            # the caller until it runs.
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hostreg-stager")
            try:
                self._worker = self._executor.submit(threading.get_ident).result()
            except RuntimeError as e:  # no thread to be had (a thread limit)
                self._executor.shutdown(wait=False, cancel_futures=True)
                raise StagingError(f"cannot start the staging thread: {e}") from e
        if async_staging and accelerator_available():
            # Made on the caller's thread, as DCP's DefaultStager does: a stream of its own,
            # never the caller's compute stream.
            self._stream = torch.Stream()

    def __enter__(self) -> Stager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def arenas_created(self) -> int:
        """How many arenas this stager has made (for tests and benchmarks)."""
        return self._pool.created

    @property
    def should_synchronize_after_execute(self) -> bool:
        return self._synchronize_after_execute

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any] | Future:
        """Copy ``state_dict`` into staging memory; returns the staged copy (a new dict of new
        tensors over the buffer), or with ``async_staging`` a ``Future`` of it."""
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict, not {type(state_dict).__name__}")
        if self._closed:
            raise HostregError("Stager.stage() after close()")
        # On the caller's thread, at save time (the runtime and its device are set up by then):
        # the staging thread registers for the caller's device (AscendCL's contexts are per thread).
        _core.note_caller_device()
        if not self.async_staging:
            return self._stage_now(state_dict, None)
        # What can be refused now is refused here, not on the future, which dcp.async_save
        # may report as a success (the class docstring says when); the worker takes the results.
        flat = flatten_checked(state_dict)  # TypeError for what no arena holds, naming the entry
        prepared = None
        if not self._pool.slots:  # the first arena: the room for it is known now (later, old arenas may be freed first)
            prepared = self._check_first_room(state_dict, flat)
        ready = None
        if self._stream is not None:  # the copies start after the work queued so far
            ready = torch.Event()
            ready.record()
        with self._submit:  # never the pool's lock: the worker may hold that for seconds
            if self._closed:
                raise HostregError("Stager.stage() after close()")
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hostreg-stager")
                self._worker = None  # learned by the first task below
            try:
                future = self._executor.submit(self._stage_now, state_dict, ready, flat, prepared)
            except RuntimeError as e:  # no thread to be had (a thread limit): nothing was staged
                # The work item sits queued in that executor: drop it with the executor, so
                # that no later thread stages this state dict after all.
                executor, self._executor = self._executor, None
                executor.shutdown(wait=False, cancel_futures=True)
                raise StagingError(f"cannot start the staging thread: {e}") from e
            # Kept for synchronize_staging(): its completion only, not the staged dict (which
            # would keep the buffer busy until the next stage()).
            done: Future = Future()
            future.add_done_callback(lambda f: settle(done, f))
            self._future = done
        return future

    def _check_first_room(self, state_dict: dict[str, Any], flat: Flat) -> Prepared | None:
        """StagingError when the first arena cannot have the room it needs. The tensors' own
        bytes are a cheap first answer (about 0.1 us a tensor); only when they do not fit is
        the exact layout (a few us a tensor, then handed to the staging thread) computed and
        judged, so nothing that fits is refused. (An arena larger than its tensors' bytes, as
        for views with gaps between them in a larger storage, may still be refused on the
        staging thread, on the future.)"""
        kw = {"pin": self.pin_memory, "share": self.share_memory}
        try:
            Arena.check_room(sum(map(nbytes_of, flat[0])), **kw)
            return None
        except StagingError:
            prepared = layout_of(state_dict, flat)
            Arena.check_room(prepared[0].nbytes, **kw)
            return prepared

    def _stage_now(
        self, state_dict: dict[str, Any], ready: Any, flat: Flat | None = None, prepared: Prepared | None = None
    ) -> dict[str, Any]:
        if self.async_staging and self._worker is None:
            self._worker = threading.get_ident()
        with self._pool_lock:
            if self._released:
                raise HostregError("Stager.stage() after close()")
            with collector_paused():
                if flat is None:
                    flat, key = self._flatten_now(state_dict)
                else:
                    key = source_key(flat[0])
            try:
                return self._stage_as(state_dict, ready, flat, key, prepared)
            except StagingError:
                raise
            except Exception as e:  # a layout or a view of sources that the caller changed meanwhile
                if self.async_staging and _changed(flat[0], key):
                    raise StagingError(_CHANGED) from e
                raise

    def _stage_as(
        self, state_dict: dict[str, Any], ready: Any, flat: Flat, key: tuple, prepared: Prepared | None
    ) -> dict[str, Any]:
        """The stage of ``state_dict`` (``flat``) whose sources' :func:`source_key` is ``key``,
        under the pool lock."""
        with collector_paused():
            grouping = None  # the sources' grouping, when the layout is known to be theirs now
            if prepared is None:
                prepared = self._layout_for(state_dict, flat, key)
                grouping = prepared[0].grouping
        buf = self._pool.acquire(
            prepared,
            max_buffers=self.max_buffers,
            wait_timeout_s=self.wait_timeout_s,
            pin_memory=self.pin_memory,
            share_memory=self.share_memory,
            closed=lambda: self._closed,
        )  # may wait for a buffer: the collector stays on
        tensors, values = prepared[1], prepared[2]
        if ready is not None and self._stream is not None:
            self._stream.wait_event(ready)
        with collector_paused():
            # acquire() has just seen the buffer's storages unmoved, under the pool lock
            # _layout_for's grouping is these sources' (computed from them now, or from sources
            # of an equal key); a layout the caller's thread made earlier may be older than them
            buf.plan.copy(tensors, stream=self._stream, checked=True, key=key, grouping=grouping, src_key=key)
            if self.async_staging and _changed(tensors, key):
                # The caller's threads ran meanwhile: a source freed, resized or replaced (its
                # memory unmapped mid-copy is a StagingError of the copy itself).
                raise StagingError(_CHANGED)
            return buf.issue(values)

    def _flatten_now(self, state_dict: dict[str, Any]) -> tuple[Flat, tuple]:
        """(flattened, source_key) of a state dict staged on the caller's thread. Sources of the
        last stage's structure and key passed its type check (a sparse, mkldnn or strided
        nested tensor has no address or sizes to give a key; a quantized one has dtypes of its
        own; other kinds are other types): only different ones are checked (TypeError)."""
        flat = _tree.flatten(state_dict)
        last = self._last_layout
        if last is not None and last[0] == flat[2]:
            try:
                key = source_key(flat[0])
            except Exception:  # no address or sizes (or a subclass that refuses): the check below names it
                key = None
            if key is not None and key == last[1]:
                return flat, key
        flat = check_flat(flat)
        return flat, source_key(flat[0])

    def _layout_for(self, state_dict: dict[str, Any], flat: Flat, key: tuple) -> Prepared:
        """The layout of ``state_dict``: the last stage's when its structure and its sources'
        :func:`source_key` are the last stage's (the usual save after save: no per-tensor
        layout work), else computed (and kept for the next stage)."""
        tensors, values, spec = flat
        last = self._last_layout
        if last is not None and last[0] == spec and last[1] == key:
            return last[2], tensors, values
        prepared = layout_of(state_dict, flat)
        self._last_layout = (spec, key, prepared[0])
        return prepared

    def synchronize_staging(self) -> None:
        """Wait until the last :meth:`stage` call's copy is done (re-raising its failure); after
        it the source may be modified. Nothing to wait for in sync mode."""
        future = self._future
        if future is not None:
            future.result()

    def close(self) -> None:
        """Wait for staging in progress, then unregister and release every arena. Idempotent,
        and callable from any thread, the staging thread's own included (a future's
        done-callback runs there): then the staging that just finished is the one in progress,
        and stagings still queued behind it fail with :class:`hostreg.HostregError` on their futures. A
        staging still waiting for a free buffer fails the same way. Tensors still held
        elsewhere stay valid (no longer page-locked) until they are gone."""
        self._closed = True  # no stage() from here on; a staging waiting for a buffer gives up
        with self._submit:  # what was submitted and is copying still runs to the end
            executor, self._executor = self._executor, None
        on_worker = self._worker is not None and threading.get_ident() == self._worker
        if executor is not None:
            executor.shutdown(wait=not on_worker)  # a thread cannot wait for itself
        with self._pool_lock:
            self._future = None
            self._pool.close()
            self._released = True
