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
empty tensors take no bytes.
"""

from __future__ import annotations

import copy
import operator
import os
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import _core, _hostreg
from ._core import HostRegisterFlags
from ._errors import StagingError

ALIGNMENT = 256


def _raise_last(what: str) -> None:
    err = _core.last_error()
    _core.log.warning("%s: %s, native %d: %s", what, err.code, err.native, err.message)
    raise StagingError(f"{what}: {err.code}: {err.message}")


class Arena:
    """One torch ``UntypedStorage`` of ``nbytes`` bytes, prepared and (optionally) registered.

    - ``share=True``: torch shared memory (``UntypedStorage._new_shared``), so views pass
      through ``torch.multiprocessing`` without a copy; else ordinary CPU memory.
    - Before anything is handed out, every page is allocated (an unnamed ``/dev/shm`` file,
      ``hostregSharedMemoryCreate``, populated by ``hostregPrepareMemory``): a full
      ``/dev/shm`` or memory limit raises :class:`StagingError` naming ``/dev/shm``, its size
      and the bytes needed, never a SIGBUS later.
    - ``pin=True``: registered through the active backend (``hostregArenaRegister``, split
      into chunks of at most ``max_chunk_bytes``, 0 = the backend's cap) with ``flags``.
      A failure (e.g. ``RLIMIT_MEMLOCK``) raises :class:`StagingError` with hostreg's reason.

    On any failure nothing stays allocated, locked or registered. The registration is undone
    by :meth:`close`, or when the storage and every view into it are gone.
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
        size = max(nbytes, 1)
        fd = -1
        if share:
            # An unnamed /dev/shm file (hostregSharedMemoryCreate); torch maps its own
            # duplicate of the descriptor.
            code, fd = _hostreg.shared_memory_create(size)
            if code != 0:
                _raise_last(f"cannot stage {nbytes:,} bytes")
            try:
                self.storage = torch.UntypedStorage._new_shared_fd_cpu(fd, size)
            except BaseException:
                os.close(fd)
                raise
        else:
            # The CPU allocator aligns to 64 bytes: take ALIGNMENT more and start aligned.
            self.storage = torch.UntypedStorage(size + ALIGNMENT)
        self._start = -self.storage.data_ptr() % ALIGNMENT if not share else 0
        ptr, size = self.storage.data_ptr(), size + self._start  # the whole storage from its first byte
        # Every page allocated now, in the kernel and in parallel: a full /dev/shm raises
        # here, never as a SIGBUS at a later write (registering then only locks).
        code = _hostreg.prepare_memory(ptr, size, fd)
        if fd >= 0:
            os.close(fd)
        if code != 0:
            self.storage = None
            _raise_last(f"cannot stage {nbytes:,} bytes")
        self.chunks = 0
        self._finalizer: weakref.finalize | None = None
        if pin:
            code, handle, self.chunks = _hostreg.arena_register(ptr, size, int(flags), max_chunk_bytes)
            if code != 0:
                self.storage = None
                _raise_last(f"cannot register {nbytes:,} bytes of staging memory")
            # Runs once: at close(), or when the last view of the storage is gone.
            self._finalizer = weakref.finalize(self.storage, _hostreg.arena_unregister, handle)

    @property
    def data_ptr(self) -> int:
        """Address of the arena's first byte (a multiple of :data:`ALIGNMENT`)."""
        return self.storage.data_ptr() + self._start

    def view(self, offset: int, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """A contiguous tensor of ``shape`` and ``dtype`` at byte ``offset`` of the arena."""
        first = (self._start + offset) // dtype.itemsize
        return torch.empty(0, dtype=dtype).set_(self.storage, first, shape, _contiguous_strides(shape))

    def close(self) -> None:
        """Undo the registration now (views stay valid, no longer page-locked). Idempotent."""
        if self._finalizer is not None:
            self._finalizer()


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
    counts, shapes and dtypes, measured once and again only when a destination moved. Holds the tensors (so the addresses stay
    valid). Sources are checked in bulk on every copy; any that do not fit the one-batch
    path (strided, other device or dtype, conjugate views) take ``Tensor.copy_``."""

    def __init__(self, dst: list[torch.Tensor]) -> None:
        self.dst = dst
        self.ids = list(map(id, dst))
        self._measure()

    def _measure(self) -> None:
        dst = self.dst
        self.ptrs = list(map(torch.Tensor.data_ptr, dst))
        self.nbytes = list(map(_nbytes, dst))
        self.shapes = list(map(_shape, dst))
        self.dtypes = list(map(_dtype, dst))
        self.batchable = all(map(_is_cpu, dst)) and all(map(torch.Tensor.is_contiguous, dst))
        self.complex = any(d.is_complex for d in set(self.dtypes))

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
            _hostreg.copy_batch(self.ptrs, list(map(torch.Tensor.data_ptr, src)), self.nbytes, threads)
            return
        _copy_one_by_one(src, self.dst, threads)


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
    _hostreg.copy_batch(dptr, sptr, nbytes, threads)
    for dev in devices:
        torch.get_device_module(dev).synchronize(dev)


class StagedDict(dict):
    """A staged state dict: a plain ``dict`` that also remembers how to copy into it fast
    (and, unlike ``dict``, can be weakly referenced)."""

    _hostreg_plan: _CopyPlan | None = None


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
    staged = stage_layout(state_dict, pin_memory=pin_memory, share_memory=share_memory).state_dict
    return StagedDict(staged) if type(staged) is dict else staged


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
    plan = getattr(dst, "_hostreg_plan", None)
    if plan is None or plan.ids != list(map(id, d_list)):  # plan.copy checks where they live
        plan = _CopyPlan(d_list)
        if isinstance(dst, StagedDict):
            dst._hostreg_plan = plan
    plan.copy(s_list, threads)
    return dst
