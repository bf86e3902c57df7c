"""Copying a state dict's values into its staged copy.

A :class:`CopyPlan` is made once for a fixed list of destination leaves (from
:func:`hostreg.torch.create_cpu_state_dict` or a :class:`hostreg.torch.Stager` buffer, or any
tensors). When the sources share storages exactly as the destinations do (the same grouping,
see ``_layout.py``) and have the destinations' dtypes, shapes and strides, the copy is one
memcpy per span, all CPU spans in one parallel batch with the GIL released
(``hostregCopyBatch``); spans on an accelerator are copied with ``copy_`` (non-blocking, one
per span, on the given side stream if any) and synchronised before returning. Anything else
is copied leaf by leaf with ``Tensor.copy_``, refusing (ValueError) destinations tied
together whose sources are not. No copy records autograd history (as torch's own)."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from itertools import repeat
from operator import is_
from typing import Any

import torch

from .. import _hostreg
from .._core import last_error
from .._errors import StagingError
from ._dtensor import local_of
from ._layout import Grouping, group, is_cpu
from ._sources import _apart, _check_sources, _extent, _leaf_key, _span_ptrs, _views, refuse_overlap


def copy_batch(dst: list[int], src: list[int], nbytes: list[int], threads: int) -> None:
    """``hostregCopyBatch`` over these addresses; :class:`StagingError` (naming the buffer)
    where one's memory was unmapped during the copy (a source's storage freed or resized by
    another thread meanwhile): the C core survives the fault and says so."""
    if _hostreg.copy_batch(dst, src, nbytes, threads) != 0:
        raise StagingError(f"a staging copy failed: {last_error().message}")


class CopyPlan:
    """Copying into a fixed list of destination leaves (see the module docstring). With
    ``weak``, the plan holds them weakly (a plan cached beside their arena must not keep it
    alive)."""

    def __init__(
        self,
        dst: list[torch.Tensor],
        weak: bool = False,
        made_for: tuple | None = None,
        grouping: Grouping | None = None,
    ) -> None:
        """``made_for``: (source_key, grouping) of the sources the destinations were laid out
        for (by ``layout_of``), so that a first copy from exactly those sources does not group
        them again; dropped when the destinations change. ``grouping``: the destinations' own
        :func:`group`, when the caller knows it (staged tensors just laid out)."""
        self._refs: list[Any] = [weakref.ref(t) for t in dst] if weak else list(dst)
        self._weak = weak
        self.ids = list(map(id, dst))
        self._measure([local_of(t) for t in dst], grouping)
        self._made_for = made_for
        self._src_key: object = None  # what the sources' check and grouping were last done for
        self._fast = False
        self._replay: tuple | None = None  # (source_key, memcpy batch) of the last copy, all on the CPU

    @property
    def dst(self) -> list[torch.Tensor]:
        return list(map(weakref.ref.__call__, self._refs)) if self._weak else self._refs

    def alive(self) -> bool:
        """All destinations still exist (always, for a plan that holds them)."""
        return not self._weak or not any(map(is_, map(weakref.ref.__call__, self._refs), repeat(None)))

    def _measure(self, dlocals: list[torch.Tensor], grouping: Grouping | None = None) -> None:
        self.grouping = grouping if grouping is not None else group(dlocals)
        self._dviews = _views(dlocals)
        self.dtypes, self.shapes, self.strides, devices = self._dviews
        self.dptrs = _span_ptrs(dlocals, self.grouping)
        self.dids = list(map(id, dlocals))
        self.daddrs = list(map(torch.Tensor.data_ptr, dlocals))
        self.span_cpu = [True] * len(self.grouping.spans)
        if not set(devices) <= {_CPU}:
            for d, s in zip(devices, self.grouping.group):
                if s >= 0 and d.type != "cpu":
                    self.span_cpu[s] = False

    def _dst_locals(self) -> list[torch.Tensor]:
        return [local_of(t) for t in self.dst]

    def still_valid(self) -> bool:
        """The destinations still live where, and are laid out as, the plan says (no
        ``.data =``, ``set_``, ``t_()`` or ``share_memory_()`` changed one)."""
        return self._unchanged(self._dst_locals())

    def _unchanged(self, dlocals: list[torch.Tensor]) -> bool:
        # The same tensor objects, at the same addresses, with the same dtypes, shapes and
        # strides (t_(), .data = a view as another dtype, set_() change them in place).
        return (
            list(map(id, dlocals)) == self.dids
            and list(map(torch.Tensor.data_ptr, dlocals)) == self.daddrs  # every one, not a span's first
            and _views(dlocals) == self._dviews
        )

    def copy(
        self,
        src: list[torch.Tensor],
        threads: int = 0,
        stream: Any = None,
        *,
        checked: bool = False,
        key: object = None,
        grouping: Grouping | None = None,
        src_key: tuple | None = None,
    ) -> None:
        """Copy ``src`` leaf by leaf (pairwise) into the destinations, wherever they are now.

        Copies from an accelerator are issued on ``stream`` (a ``torch.Stream``; None: the
        current stream) and waited for (that stream, or the device) before returning.
        ``checked``: the caller knows the destinations are as the plan measured them (it has
        just seen :meth:`still_valid` answer True, or, for a Stager buffer whose leaves are its
        own, seen its storages unmoved), so they are not measured again. ``key``: a value
        the caller vouches is equal between two calls only when the sources, and the
        destinations unless ``checked``, lie where and are viewed as they were (their
        :func:`source_key`); a key equal to the last copy's makes this copy a replay of that
        one's memcpy batch, with no per-tensor work. ``grouping``: the sources' own
        :func:`group` (their layout's), when the caller has it, so it is not computed again.
        ``src_key``: the sources' :func:`source_key`, when the caller has it (their views are
        then compared with the destinations' a property at a time)."""
        if len(src) != len(self.ids):
            raise ValueError(f"source has {len(src)} tensors, destination {len(self.ids)}")
        replay = self._replay
        if key is not None and replay is not None and replay[0] == key:
            copy_batch(replay[1], replay[2], replay[3], threads)
            return
        self._replay = None
        dlocals = self._dst_locals()
        if not checked and not self._unchanged(dlocals):
            self._measure(dlocals)  # a destination was replaced, moved or reshaped: measure again
            self._src_key = None
            self._made_for = None
        slocals = [local_of(t) for t in src]
        # What the sources' check, grouping and fast-path decision below depend on: the key
        # when the caller gives one (it changes whenever the sources' places or views do),
        # else their storages' addresses and views.
        storages: list[Any] | None = None
        if key is not None:
            views: object = key
        else:
            storages = list(map(torch.Tensor.untyped_storage, slocals))
            views = [(st.data_ptr(), t.storage_offset(), *_leaf_key(t)) for st, t in zip(storages, slocals)]
        if views != self._src_key:  # the sources' storages or views changed since the last copy
            _check_sources(
                slocals, storages if storages is not None else list(map(torch.Tensor.untyped_storage, slocals))
            )
            made_for = self._made_for
            if grouping is None and made_for is not None and src_key is not None and src_key == made_for[0]:
                grouping = made_for[1]  # the very sources the destinations were laid out for
            sg = grouping if grouping is not None else group(slocals)
            # Destinations with spans of their own (conjugate or negative views, elements that
            # alias one another) are written with copy_, as torch writes them, never as bytes.
            self._fast = (
                not any(self.grouping.own)
                and sg.shape_key() == self.grouping.shape_key()
                and self._same_views(slocals, sg, src_key)
            )
            self._sgroup = sg
            self._src_key = views
        with torch.no_grad(), _issuing_on(stream) as devices:  # as torch's _copy_state_dict: no autograd history
            if self._fast:
                batch = self._copy_spans(slocals, dlocals, threads, devices)
                if key is not None and batch is not None:  # every span on the CPU: the next copy may replay it
                    self._replay = (key, *batch)
            else:
                self._copy_leaves(slocals, dlocals, threads, devices)

    def _same_views(self, slocals: list[torch.Tensor], sg: Grouping, src_key: tuple | None) -> bool:
        """Every non-empty source has its destination's dtype and shape, and, unless it has a
        span of its own (copied with ``copy_``), its strides."""
        if src_key is not None and src_key[2] == self.dtypes and src_key[3] == self.shapes:
            if src_key[4] == self.strides:
                return True  # the usual case, compared a property at a time
        return all(
            _leaf_key(t)[0:2] == d[0:2] if own else _leaf_key(t)[0:3] == d[0:3]
            for t, d, s, own in zip(slocals, zip(self.dtypes, self.shapes, self.strides), sg.group, sg.own)
            if s >= 0
        )

    def _copy_spans(
        self, slocals: list[torch.Tensor], dlocals: list[torch.Tensor], threads: int, devices: set
    ) -> tuple[list[int], list[int], list[int]] | None:
        """The span-by-span copy; returns its memcpy batch (destinations, sources, bytes) when
        that was all of it (no span on an accelerator or resolved with copy_), else None."""
        g = self._sgroup
        sptrs = _span_ptrs(slocals, g)
        nbytes = [n for _, n in g.spans]
        first = g.first
        own = [g.own[i] for i in first]  # a span is a tensor's own when its (only) tensor is
        src_cpu = list(map(is_cpu, map(slocals.__getitem__, first)))
        if not any(own) and all(self.span_cpu) and all(src_cpu) and all(nbytes) and _apart(sptrs, self.dptrs, nbytes):
            cpu = batch = list(range(len(nbytes)))  # the usual copy: every span a memcpy, checked at once
            lists = (self.dptrs, sptrs, nbytes)
        else:
            cpu = [s for s in range(len(nbytes)) if not own[s] and self.span_cpu[s] and src_cpu[s]]
            keep = refuse_overlap(
                [(sptrs[s], sptrs[s] + nbytes[s]) for s in cpu],
                [(self.dptrs[s], self.dptrs[s] + nbytes[s]) for s in cpu],
            )
            batch = [cpu[k] for k in keep]
            lists = ([self.dptrs[s] for s in batch], [sptrs[s] for s in batch], [nbytes[s] for s in batch])
        copy_batch(*lists, threads)
        if len(cpu) == len(nbytes):
            return lists
        on_cpu = set(cpu)
        for s in range(len(nbytes)):
            if s in on_cpu:
                continue
            i = first[s]
            src, dst = slocals[i], dlocals[i]
            if own[s]:  # a resolved conjugate or negative view
                dst.copy_(src, non_blocking=not src.is_cpu)
            else:  # a span on an accelerator: its bytes in one copy
                _bytes_at(dst, self.dptrs[s], nbytes[s]).copy_(_bytes_at(src, sptrs[s], nbytes[s]), non_blocking=True)
            if not src.is_cpu:
                devices.add(src.device)
        return None

    def _copy_leaves(
        self, slocals: list[torch.Tensor], dlocals: list[torch.Tensor], threads: int, devices: set
    ) -> None:
        dg = self.grouping
        sg = group(slocals)
        tied: dict[int, tuple[int, int]] = {}
        for i, (ds, ss) in enumerate(zip(dg.group, sg.group)):
            if ds < 0:
                continue
            src_place = (ss, sg.offset[i] - dg.offset[i])
            if tied.setdefault(ds, src_place) != src_place:
                raise ValueError(
                    f"destination tensors {dg.first[ds]} and {i} share storage (tied weights or views) but "
                    "their sources do not: copying one would overwrite the other; stage the source again"
                )
        for i, (s, d) in enumerate(zip(slocals, dlocals)):
            if s.shape != d.shape:
                raise ValueError(f"tensor {i}: source shape {tuple(s.shape)} != destination {tuple(d.shape)}")
        # Every CPU pair is checked before anything is copied: a source that is another pair's
        # destination would otherwise be read before or after it is written, by order.
        cpu = [i for i, (s, d) in enumerate(zip(slocals, dlocals)) if s.is_cpu and d.is_cpu]
        same = [
            slocals[i].data_ptr() == dlocals[i].data_ptr()
            and _leaf_key(slocals[i]) == _leaf_key(dlocals[i])
            and slocals[i].is_conj() == dlocals[i].is_conj()
            and slocals[i].is_neg() == dlocals[i].is_neg()
            for i in cpu
        ]
        copy = set(
            cpu[k] for k in refuse_overlap([_extent(slocals[i]) for i in cpu], [_extent(dlocals[i]) for i in cpu], same)
        )
        batch = []
        for i, (s, d) in enumerate(zip(slocals, dlocals)):
            if s.is_cpu and d.is_cpu and i not in copy:
                continue  # empty, or its own destination
            if (
                s.is_cpu
                and d.is_cpu
                and s.dtype == d.dtype
                and s.is_contiguous()
                and d.is_contiguous()
                and not (s.is_conj() or s.is_neg() or d.is_conj() or d.is_neg())
            ):
                batch.append(i)
            else:
                d.copy_(s, non_blocking=not s.is_cpu)
                if not s.is_cpu:
                    devices.add(s.device)
        copy_batch(
            [dlocals[i].data_ptr() for i in batch],
            [slocals[i].data_ptr() for i in batch],
            [dlocals[i].nbytes for i in batch],
            threads,
        )


_CPU = torch.device("cpu")


@contextlib.contextmanager
def _issuing_on(stream: Any) -> Iterator[set]:
    """Accelerator copies made inside go on ``stream`` (if any); on leaving, every copy issued
    (the set collects the source devices) is waited for, also when one of them raised."""
    devices: set[torch.device] = set()
    try:
        with stream if stream is not None else contextlib.nullcontext():
            yield devices
    finally:
        if stream is not None:
            stream.synchronize()
        else:
            for dev in devices:
                torch.get_device_module(dev).synchronize(dev)


def _bytes_at(t: torch.Tensor, ptr: int, n: int) -> torch.Tensor:
    """A uint8 tensor over the n bytes at address ptr of t's storage."""
    st = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(st, ptr - st.data_ptr(), (n,), (1,))
