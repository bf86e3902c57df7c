"""Fast staging: a whole state dict in one shared, registered arena.

PyTorch's shared+pinned path (``_create_cpu_state_dict(share_memory=True, pin_memory=True)``)
makes one shared-memory object, one file descriptor and one registration per tensor, and
makes them again for every save (0.1-0.3 GiB/s measured on a 2-core VM, ``docs/staging.md``). Here a state dict gets one torch shared storage; its
backing store is reserved and populated up front (so a full ``/dev/shm`` raises here, not as
a SIGBUS later), it is registered once through the active backend, and every tensor is a
view into it. Re-staging copies into the same arena.

Layout: tensors are placed in traversal order, each at an offset aligned to
:data:`ALIGNMENT` bytes (256: any dtype's element size divides it, a cache line and AVX-512
vector fit, and it is the alignment CUDA's allocator gives device buffers, so copy engines
see no misaligned starts). 0-d tensors are placed too (PyTorch's path leaves them unpinned);
empty tensors take no bytes. Each staged tensor has a storage of its own holding exactly its
bytes, inside the arena (``hostreg/_sharing.py``): ``torch.save`` writes it as it is, and
DCP's writers do not clone it.
"""

from __future__ import annotations

import copy
import operator
import os
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import _core, _hostreg, _sharing
from ._core import HostRegisterFlags
from ._errors import StagingError

ALIGNMENT = 256


def _raise_last(what: str) -> None:
    err = _core.last_error()
    _core.log.warning("%s: %s, native %d: %s", what, err.code, err.native, err.message)
    raise StagingError(f"{what}: {err.code}: {err.message}")


class Arena:
    """The staging memory of one state dict: ``nbytes`` bytes, every page allocated, and
    (optionally) registered once. Its tensors come from :meth:`view`.

    - ``share=True``: an unnamed ``/dev/shm`` file (``$HOSTREG_SHM_DIR``), mapped shared, so
      the tensors reach another process without a copy (``torch.multiprocessing`` passes the
      file once per message, see ``hostreg/_sharing.py``); else private anonymous memory.
    - Every page is allocated up front, in the kernel (``hostregPrepareMemory``): a full
      ``/dev/shm`` or a memory limit raises :class:`StagingError` naming it, its size and the
      bytes needed, never a SIGBUS later.
    - ``pin=True``: registered through the active backend (in chunks of at most
      ``max_chunk_bytes``, 0 = the backend's cap) with ``flags``. A failure (e.g.
      ``RLIMIT_MEMLOCK``) raises :class:`StagingError` with hostreg's reason.

    All of it is one ``_hostreg.StagingBuffer``, made whole or not at all: an exception at any
    point, a ``KeyboardInterrupt`` included, leaves nothing allocated, locked or registered.
    The registration is undone by :meth:`close`, or when this object and every tensor of it are
    gone (each tensor holds the buffer).
    """

    def __init__(
        self,
        nbytes: int,
        *,
        pin: bool = True,
        share: bool = True,
        flags: int = HostRegisterFlags.Portable,
        max_chunk_bytes: int = 0,
    ) -> None:
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        self.nbytes = nbytes
        code, buf = _hostreg.staging_buffer_create(max(nbytes, 1), share, pin, int(flags), max_chunk_bytes)
        if code != 0:
            _raise_last(f"cannot {'register' if code in (712, 801) else 'stage'} {nbytes:,} bytes of staging memory")
        self.buffer = buf
        self.chunks = buf.chunks
        _sharing.track(buf)

    @property
    def data_ptr(self) -> int:
        """Address of the arena's first byte (page-aligned)."""
        return self.buffer.data_ptr

    def view(self, offset: int, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A contiguous tensor of ``shape`` and ``dtype`` at byte ``offset`` of the arena, with a
        storage of its own holding exactly its bytes (so ``torch.save`` and DCP's writers take
        it as it is) that keeps the arena alive."""
        return _sharing.tensor_view(self.buffer, offset, shape, dtype)

    def close(self) -> None:
        """Undo the registration now (views stay valid, no longer page-locked). Idempotent."""
        self.buffer.unregister()


def _contiguous_strides(shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    acc = 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


# ---- state-dict structure -------------------------------------------------------------


def _check_tensor(path: str, t: torch.Tensor) -> None:
    if type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter):
        raise TypeError(
            f"{path}: hostreg staging takes plain tensors, not {type(t).__name__} "
            "(use PyTorch's _create_cpu_state_dict for DTensor/ShardedTensor)"
        )
    if t.is_nested:
        raise TypeError(f"{path}: hostreg staging takes plain tensors, not nested tensors")
    if t.layout != torch.strided:
        raise TypeError(f"{path}: hostreg staging takes strided tensors, not {t.layout}")
    if t.is_quantized:
        raise TypeError(f"{path}: hostreg staging takes plain tensors, not quantized ({t.dtype}) ones")


# The walkers below are plain recursive functions, not nested closures: a recursive closure
# is a reference cycle, and anything it holds (the staged views) would then live until the
# garbage collector runs instead of being freed, and unregistered, at once.


def _rebuild(obj: Any, leaf: Callable[[torch.Tensor], Any], other: Callable[[Any], Any]) -> Any:
    """Copy of a nested dict/list/tuple structure with tensors mapped by ``leaf`` and other
    values by ``other``. Dict subclasses (OrderedDict) and named tuples keep their type."""
    if isinstance(obj, torch.Tensor):
        return leaf(obj)
    if isinstance(obj, dict):
        items = [(k, _rebuild(x, leaf, other)) for k, x in obj.items()]
        try:
            return type(obj)(items)
        except TypeError:
            return dict(items)
    if isinstance(obj, (list, tuple)):
        values = [_rebuild(x, leaf, other) for x in obj]
        if isinstance(obj, list):
            return values
        return type(obj)(*values) if hasattr(obj, "_fields") else type(obj)(values)
    return other(obj)


def _tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors of a nested state dict, in the order :func:`_rebuild` visits them."""
    return _flatten(obj)[0]


def _flatten(obj: Any) -> tuple[list[torch.Tensor], Any]:
    """(the tensors in :func:`_rebuild`'s order, the skeleton: containers and keys without
    the tensors, equal for two state dicts exactly when their tensors match by position)."""
    found: list[torch.Tensor] = []
    return found, _skeleton(obj, found)


def _skeleton(v: Any, found: list[torch.Tensor]) -> Any:
    if isinstance(v, torch.Tensor):
        found.append(v)
        return 0
    if isinstance(v, dict):
        return (tuple(v.keys()), tuple([_skeleton(x, found) for x in v.values()]))
    if isinstance(v, (list, tuple)):
        return (len(v), tuple([_skeleton(x, found) for x in v]))
    return None


def _paths(obj: Any, path: tuple = (), out: dict[tuple, torch.Tensor] | None = None) -> dict[tuple, torch.Tensor]:
    """{path of keys and indices: tensor} for every tensor of a nested state dict."""
    out = {} if out is None else out
    if isinstance(obj, torch.Tensor):
        out[path] = obj
    elif isinstance(obj, dict):
        for k, x in obj.items():
            _paths(x, (*path, k), out)
    elif isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            _paths(x, (*path, i), out)
    return out


@dataclass(frozen=True)
class _Slot:
    offset: int
    shape: torch.Size
    dtype: torch.dtype
    nbytes: int


def _layout(state_dict: Any) -> tuple[list[_Slot], int]:
    tensors = _tensors(state_dict)
    for t in tensors:
        if (type(t) is not torch.Tensor and not isinstance(t, torch.nn.Parameter)) or t.layout != torch.strided or t.is_quantized or t.is_nested:
            path = next(p for p, x in _paths(state_dict).items() if x is t)
            _check_tensor(".".join(map(str, path)), t)
    slots: list[_Slot] = []
    offset = 0
    for t in tensors:
        offset = -(-offset // ALIGNMENT) * ALIGNMENT
        nbytes = t.numel() * t.element_size()
        slots.append(_Slot(offset, t.shape, t.dtype, nbytes))
        offset += nbytes
    return slots, offset


def signature(state_dict: Any) -> tuple:
    """Structure of a state dict for reuse decisions: containers, keys, tensor shapes and
    dtypes, and the types of other values."""

    def sig(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return ("T", tuple(obj.shape), obj.dtype)
        if isinstance(obj, dict):
            return (type(obj), tuple((k, sig(v)) for k, v in obj.items()))
        if isinstance(obj, (list, tuple)):
            return (type(obj), tuple(sig(v) for v in obj))
        return type(obj)

    return sig(state_dict)


# ---- copying ----------------------------------------------------------------------------

_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")
_is_cpu = operator.attrgetter("is_cpu")
_nbytes = operator.attrgetter("nbytes")


class _CopyPlan:
    """What copying into a fixed list of destination tensors needs: their addresses, byte
    counts, shapes and dtypes, measured once and again only when a destination moved. Sources
    are checked in bulk on every copy; any that do not fit the one-batch path (strided, other
    device or dtype, conjugate views) take ``Tensor.copy_``. With ``weak``, the plan holds its
    destinations weakly (a plan cached beside their arena must not keep them alive)."""

    def __init__(self, dst: list[torch.Tensor], weak: bool = False) -> None:
        self._refs: list[Any] = [weakref.ref(t) for t in dst] if weak else list(dst)
        self._weak = weak
        self.ids = list(map(id, dst))
        self._measure()

    @property
    def dst(self) -> list[torch.Tensor]:
        return [r() for r in self._refs] if self._weak else self._refs

    def alive(self) -> bool:
        """All destinations still exist (always, for a plan that holds them)."""
        return not self._weak or all(r() is not None for r in self._refs)

    def _measure(self) -> None:
        dst = self.dst
        self.ptrs = list(map(torch.Tensor.data_ptr, dst))
        self.nbytes = list(map(_nbytes, dst))
        self.shapes = list(map(_shape, dst))
        self.dtypes = list(map(_dtype, dst))
        self.batchable = all(map(_is_cpu, dst)) and all(map(torch.Tensor.is_contiguous, dst))
        self.complex = any(d.is_complex for d in set(self.dtypes))
        spans = [(p, p + n) for p, n in zip(self.ptrs, self.nbytes) if n]
        self.span = (min(s[0] for s in spans), max(s[1] for s in spans)) if spans else (0, 0)

    def still_valid(self) -> bool:
        """The destinations still live where the plan says (no ``.data =``, ``set_``, or a
        storage moved by torch, e.g. pickled under the file_system sharing strategy)."""
        return list(map(torch.Tensor.data_ptr, self.dst)) == self.ptrs and list(map(_shape, self.dst)) == self.shapes

    def copy(self, src: list[torch.Tensor], threads: int = 0) -> None:
        """Copy ``src`` pairwise into the destinations (wherever they live now)."""
        if len(src) != len(self.dst):
            raise ValueError(f"source has {len(src)} tensors, destination {len(self.dst)}")
        threads = threads or len(os.sched_getaffinity(0))
        if not self.still_valid():  # a destination was replaced or moved: measure again
            self._measure()
        if (
            self.batchable
            and list(map(_shape, src)) == self.shapes
            and list(map(_dtype, src)) == self.dtypes
            and all(map(_is_cpu, src))
            and all(map(torch.Tensor.is_contiguous, src))
            and not (self.complex and any(t.is_conj() or t.is_neg() for t in src))
        ):
            sptrs = list(map(torch.Tensor.data_ptr, src))
            if _refuse_overlap(sptrs, self.nbytes, self.ptrs, self.span):
                keep = [i for i, (s, d) in enumerate(zip(sptrs, self.ptrs)) if s != d]  # copies onto themselves
                _hostreg.copy_batch([self.ptrs[i] for i in keep], [sptrs[i] for i in keep], [self.nbytes[i] for i in keep], threads)
                return
            _hostreg.copy_batch(self.ptrs, sptrs, self.nbytes, threads)
            return
        _copy_one_by_one(src, self.dst, threads)


def _refuse_overlap(sptrs: list[int], nbytes: list[int], dptrs: list[int], dspan: tuple[int, int]) -> bool:
    """ValueError when a source's bytes overlap any destination's (as ``Tensor.copy_``
    refuses partial overlap): a batch memcpy would read bytes it has already overwritten. A
    tensor copied onto exactly itself is allowed (nothing to copy); returns whether there are
    such pairs. O(n) when no source falls inside the destinations' span (the usual case: they
    are one arena), else a sweep."""
    lo, hi = dspan
    if not any(p < hi and p + n > lo for p, n in zip(sptrs, nbytes) if n):
        return False
    pairs = [i for i, n in enumerate(nbytes) if n and sptrs[i] != dptrs[i]]
    events = sorted([(sptrs[i], sptrs[i] + nbytes[i], "s", i) for i in pairs] + [(dptrs[i], dptrs[i] + nbytes[i], "d", i) for i in pairs])
    open_end = {"s": (0, -1), "d": (0, -1)}  # furthest end seen so far of each kind, and whose
    for start, end, kind, i in events:
        other = "d" if kind == "s" else "s"
        if open_end[other][0] > start:
            s_i, d_i = (i, open_end[other][1]) if kind == "s" else (open_end[other][1], i)
            raise ValueError(
                f"source tensor {s_i} overlaps destination tensor {d_i}: copying would read bytes already "
                "overwritten (unsupported, as with Tensor.copy_)"
            )
        if end > open_end[kind][0]:
            open_end[kind] = (end, i)
    return len(pairs) < sum(1 for n in nbytes if n)


def _copy_one_by_one(s_list: list[torch.Tensor], d_list: list[torch.Tensor], threads: int) -> None:
    dptr: list[int] = []
    sptr: list[int] = []
    nbytes: list[int] = []
    devices: set[torch.device] = set()
    for i, (s, d) in enumerate(zip(s_list, d_list)):
        if s.shape != d.shape:
            raise ValueError(f"tensor {i}: source shape {tuple(s.shape)} != destination {tuple(d.shape)}")
        if s.is_cpu and s.dtype == d.dtype and s.is_contiguous() and d.is_contiguous() and not (s.is_conj() or s.is_neg()):
            if s.nbytes:
                dptr.append(d.data_ptr())
                sptr.append(s.data_ptr())
                nbytes.append(s.nbytes)
        else:
            d.copy_(s, non_blocking=not s.is_cpu)
            if not s.is_cpu:
                devices.add(s.device)
    if dptr and _refuse_overlap(sptr, nbytes, dptr, (min(dptr), max(p + n for p, n in zip(dptr, nbytes)))):
        keep = [i for i, (s, d) in enumerate(zip(sptr, dptr)) if s != d]  # copies onto themselves
        dptr, sptr, nbytes = [dptr[i] for i in keep], [sptr[i] for i in keep], [nbytes[i] for i in keep]
    _hostreg.copy_batch(dptr, sptr, nbytes, threads)
    for dev in devices:
        torch.get_device_module(dev).synchronize(dev)


# Copy plans of staged dicts, beside the arena their tensors live in (a staged dict is a plain
# dict, as PyTorch's own staged copy is, so that torch.save writes and torch.load reads it as
# one; it cannot carry the plan itself). Weak both ways: neither keeps the other alive.
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


# ---- public API -----------------------------------------------------------------------


@dataclass
class StagedStateDict:
    """A staged copy: ``state_dict`` (same structure as the source, tensors as views into
    ``arena``) and ``tensors`` (those views, in traversal order)."""

    state_dict: Any
    tensors: list[torch.Tensor]
    arena: Arena


def stage_layout(state_dict: Any, *, pin_memory: bool = True, share_memory: bool = True) -> StagedStateDict:
    """Allocate (one arena) the staged copy of ``state_dict`` without copying values."""
    slots, total = _layout(state_dict)
    arena = Arena(total, pin=pin_memory, share=share_memory)
    views = iter([arena.view(s.offset, s.shape, s.dtype) for s in slots])
    staged = _rebuild(state_dict, lambda t: next(views), copy.deepcopy)
    return StagedStateDict(staged, _tensors(staged), arena)


def create_cpu_state_dict(state_dict: Any, pin_memory: bool = True, share_memory: bool = True) -> dict[str, Any]:
    """hostreg's ``_create_cpu_state_dict``: same structure, one arena for every tensor.

    Returns a state dict whose tensors are uninitialised, contiguous CPU tensors of the
    source's shapes and dtypes (0-d and empty ones included), all views of one storage that
    is shared (``share_memory``; ``is_shared()`` is true and they pass through
    ``torch.multiprocessing`` without a copy) and registered once (``pin_memory``). Non-tensor
    values are deep copies. Fill it with :func:`copy_state_dict` (or PyTorch's
    ``_copy_state_dict``). The registration is undone when every tensor of it is gone.

    Raises :class:`hostreg.StagingError` when the memory cannot be reserved or locked (the
    message names the limit), ``TypeError`` for tensor types it cannot place (DTensor,
    sparse).
    """
    return stage_layout(state_dict, pin_memory=pin_memory, share_memory=share_memory).state_dict


def copy_state_dict(src: Any, dst: Any, threads: int = 0) -> Any:
    """Copy every tensor of ``src`` into the tensor at the same place in ``dst``; returns ``dst``.

    ``dst`` has the structure of ``src`` (from :func:`create_cpu_state_dict`). When every
    source is a contiguous CPU tensor of the destination's dtype and shape, all are copied by
    one parallel batch (``threads`` threads, 0 = one per CPU) with the GIL released; else
    one by one (``Tensor.copy_``; non-blocking from accelerators, synchronised before
    returning). Tensors are matched by key (like PyTorch's ``_copy_state_dict``); copying
    into the same staged dict again reuses what the first copy worked out. Raises
    ``ValueError`` when the keys or a tensor's shape differ.
    """
    s_list, s_skel = _flatten(src)
    d_list, d_skel = _flatten(dst)
    if s_skel != d_skel:  # keys in another order (go by key, as PyTorch does), or other keys
        by_path, d_paths = _paths(src), list(_paths(dst))
        if set(by_path) != set(d_paths) or len(s_list) != len(d_list):
            missing = sorted(".".join(map(str, p)) for p in set(d_paths) - set(by_path))[:3]
            extra = sorted(".".join(map(str, p)) for p in set(by_path) - set(d_paths))[:3]
            raise ValueError(f"source and destination differ in structure (missing {missing}, extra {extra})")
        s_list = [by_path[p] for p in d_paths]
    arena = _sharing.arena_of(d_list[0]) if d_list else None
    plan = _plans.get(arena) if arena is not None else None
    if plan is None or plan.ids != list(map(id, d_list)) or not plan.alive():  # plan.copy checks where they live
        plan = _CopyPlan(d_list, weak=True)
        if arena is not None:
            _plans[arena] = plan
    plan.copy(s_list, threads)
    return dst
