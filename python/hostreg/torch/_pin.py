"""In-place pinning of any CPU tensor: :func:`pin_`, :func:`unpin_`, :func:`pinned`.

``Tensor.pin_memory()`` copies a tensor into new page-locked memory (PyTorch's pinned-memory
allocator) and returns the copy. :func:`pin_` page-locks the memory a tensor already has, as
``cudaHostRegister`` does, through hostreg's active backend: a numpy-backed tensor, a
``torch.from_file`` mapping, shared memory, any CPU allocator's storage. No byte moves.

How the registration's life follows the storage's: :func:`pin_` registers the whole storage,
then gives the tensor a storage over the same bytes whose last user's release unregisters
them *first* and only then lets the original storage go (its memory may be freed and reused
at once after that, and must not still be registered: a stale registration would answer 712
to whoever pins the reused memory next). That storage cannot be resized, so its memory
cannot go while it is registered. Views of the tensor made after :func:`pin_` share it.

What :func:`pin_` refuses, because it could not keep that promise: a storage that other
tensors or storages use too (views made before, ``p.data``, a storage object kept from
``t.untyped_storage()``): any of them could free or move the memory
(``untyped_storage().resize_(0)``, ``share_memory_()``) under the registration, so pin the
tensor before making views of it. A shared storage (``share_memory_()``,
``from_file(shared=True)``) is pinned with a ``RuntimeWarning``: its bytes stay shared with
what maps them already, but the pinned storage is not torch's shared one, so sending the
tensor through ``torch.multiprocessing`` again copies it into new shared memory, away from
the processes that have it. hostreg's staging arenas are shared and registered at once.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator

import torch

from .. import _core, _hostreg
from .._core import HostRegisterFlags
from .._dropin import registered_by_hostreg
from .._errors import HostregError, cudaError


class PinError(HostregError):
    """:func:`pin_` or :func:`unpin_` was refused; ``code`` is CUDA's answer (e.g. 712,
    ``cudaErrorHostMemoryAlreadyRegistered``: a byte of the storage is registered already;
    713 from :func:`unpin_`: not pinned by :func:`pin_`; 2: the memlock limit)."""

    def __init__(self, message: str, code: cudaError) -> None:
        super().__init__(message)
        self.code = code


class _Pin:
    """One pinned storage: the registration of [ptr, ptr + nbytes), and the original storage,
    released only after the registration is undone."""

    def __init__(self, ptr: int, nbytes: int, original: torch.UntypedStorage) -> None:
        self.ptr, self.nbytes, self.original = ptr, nbytes, original
        self._lock = threading.Lock()
        self.live = False  # registered by this pin and not yet unregistered

    def unregister(self) -> cudaError:
        """Undo the registration (once). The C call comes before the mark: an interrupt between
        them leaves the pin marked live, and its release answers 713 then, harmlessly; the other
        order could leave the memory registered for good."""
        with self._lock:
            if not self.live:
                return cudaError.success
            code = cudaError(_hostreg.host_unregister(self.ptr))
            self.live = False
        return code

    # When the last tensor over the pinned storage is freed, the DLPack view's deleter (in C,
    # where no interrupt can land) undoes the registration if `live`, then drops this object,
    # and with it the original storage and maybe its memory: _hostreg.view_of(unregister=True).


# Storage address -> a weak reference to its pin, while pinned: the pinned storage's tensors
# alone keep a pin alive. Plain dict operations (atomic under the GIL), no lock: a collection
# inside pin_ may free another pin on the same thread, and an interrupt cannot leave a lock held.
_pins: dict[int, weakref.ref[_Pin]] = {}


def _index(ptr: int, pin: _Pin) -> None:
    def forget(ref: weakref.ref[_Pin], ptr: int = ptr) -> None:
        if _pins.get(ptr) is ref:
            _pins.pop(ptr, None)

    _pins[ptr] = weakref.ref(pin, forget)


def _lookup(ptr: int) -> _Pin | None:
    ref = _pins.get(ptr)
    return ref() if ref is not None else None


def _forget(ptr: int, pin: _Pin) -> None:
    ref = _pins.get(ptr)
    if ref is not None and ref() is pin:
        _pins.pop(ptr, None)


def pin_(tensor: torch.Tensor, flags: int = HostRegisterFlags.Portable) -> torch.Tensor:
    """Page-lock ``tensor``'s whole storage in place (``cudaHostRegister(ptr, nbytes, flags)``
    through the active backend) and return ``tensor``.

    The registration lasts until :func:`unpin_`, or until the storage is freed (unregistered
    before its memory is). An empty storage has nothing to lock: ``tensor`` is returned as it
    is. Raises ``TypeError`` for a non-tensor or a tensor without plain strided storage (sparse,
    nested, a DTensor: pin its local shard), ``ValueError`` for a tensor not on the CPU (device
    memory needs no page-locking; ``Tensor.pin_memory()`` is for CPU tensors too, and copies),
    and :class:`PinError` when the backend refuses: 712 if any byte of the storage is
    registered already (by an earlier :func:`pin_`, a staging arena, the drop-in), 2 when the
    memory cannot be locked (``RLIMIT_MEMLOCK``; the message says), 801 for flags the backend
    cannot honour; ``ValueError`` for a view, a storage other tensors use too, or a storage
    object held elsewhere (pin before making views); a ``RuntimeWarning`` for a shared storage
    (see the module docstring). ``pin_`` replaces the tensor's storage (``set_``): for autograd
    it is an in-place change, so pin before a graph that saves the tensor is recorded.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"pin_ takes a torch.Tensor, not {type(tensor).__name__}")
    if type(tensor) is not torch.Tensor and not isinstance(tensor, torch.nn.Parameter):
        raise TypeError(f"pin_ takes plain tensors, not {type(tensor).__name__} (for a DTensor, pin its to_local())")
    if tensor.layout != torch.strided or tensor.is_nested:
        raise TypeError(f"pin_ takes strided tensors, not {tensor.layout}{' (nested)' if tensor.is_nested else ''}")
    if tensor.device.type != "cpu":
        raise ValueError(
            f"pin_ page-locks host memory; this tensor is on {tensor.device}, which needs none "
            "(to copy a CPU tensor into pinned memory, use Tensor.pin_memory())"
        )
    original = tensor.untyped_storage()
    ptr, nbytes = original.data_ptr(), original.nbytes()
    if nbytes == 0:
        return tensor
    if _hostreg.registration(ptr) is not None:  # CUDA's answer, without a call that could half-succeed
        code = cudaError(_hostreg.host_register(ptr, nbytes, int(flags)))
        raise PinError(
            f"pin_: cudaHostRegister of {nbytes:,} bytes at {ptr:#x} failed: {code}: {_core.last_error().message}", code
        )
    if original.is_shared():
        warnings.warn(
            "pin_ of a shared storage (share_memory_(), from_file(shared=True)): its bytes stay shared with what "
            "maps them already, but the pinned storage is not torch's shared one, so sending the tensor to "
            "another process through torch.multiprocessing copies it (hostreg.torch's arenas are shared and "
            "registered at once)",
            RuntimeWarning,
            stacklevel=2,
        )
    if tensor._base is not None:  # a view keeps its base, a second tensor over the storage
        raise ValueError(
            "pin_ takes the base of a view, not the view (its base holds the same storage and could free or move "
            "it): pin_(t._base) pins the whole storage, which views made from it share"
        )
    if sys.getrefcount(original) > 3:  # this frame's name, the call's argument, the tensor's own cached object
        raise ValueError(
            "pin_: a storage object of this tensor is held elsewhere (s = t.untyped_storage(), t.storage()): "
            "resize_ on it would free the memory under the registration; drop it before pin_"
        )
    users = _storage_users(original)
    if users > 2:  # the tensor and `original` itself
        raise ValueError(
            f"pin_: the storage at {ptr:#x} is used by {users - 2} other tensor(s) or storage(s) (views made "
            "before pin_, p.data, a module's state_dict() entry, which shares its parameter's storage): any of "
            "them could free or move the memory under the registration; pin the owner instead (the parameter "
            "or buffer: `for t in (*module.parameters(), *module.buffers()): pin_(t)`, before taking a "
            "state_dict(), or once its tensors are gone; state_dict() then gives pinned tensors), or pin the tensor before making views of it (views made after pin_ share "
            "its pinned storage)"
        )
    pin = _Pin(ptr, nbytes, original)
    try:
        code = cudaError(_hostreg.host_register(ptr, nbytes, int(flags)))
        if code != cudaError.success:
            raise PinError(
                f"pin_: cudaHostRegister of {nbytes:,} bytes at {ptr:#x} failed: {code}: {_core.last_error().message}",
                code,
            )
        pin.live = True
        view = torch.from_dlpack(_hostreg.view_of(pin, ptr, nbytes, unregister=True)).untyped_storage()
        _index(ptr, pin)
        with torch.no_grad():  # set_ on a leaf that requires grad is refused otherwise
            tensor.set_(view, tensor.storage_offset(), tensor.shape, tensor.stride())
    except BaseException:
        # Also for an interrupt that landed after the registration but before `live` was set:
        # nothing was registered at ptr before (checked above), so one there now is this call's.
        reg = _hostreg.registration(ptr)
        if reg is not None and (reg.base, reg.nbytes) == (ptr, nbytes):
            pin.live = True
        pin.unregister()
        _forget(ptr, pin)
        raise
    return tensor


def _storage_users(storage: torch.UntypedStorage) -> int:
    """How many tensors and storage objects hold ``storage`` (torch's own count; 2 for one tensor
    and the storage object asked about). 2 where this torch cannot say."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return int(count(storage._cdata)) if count is not None else 2


def unpin_(tensor: torch.Tensor) -> torch.Tensor:
    """Undo :func:`pin_` now (``cudaHostUnregister``); returns ``tensor``, whose bytes stay
    where they are. Raises :class:`PinError` (713, ``cudaErrorHostMemoryNotRegistered``) when
    its storage was not pinned by :func:`pin_`, or was unpinned already; ``TypeError`` for a
    non-tensor."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"unpin_ takes a torch.Tensor, not {type(tensor).__name__}")
    if tensor.device.type != "cpu" or tensor.layout != torch.strided or tensor.is_nested:
        raise PinError(
            f"unpin_: this tensor ({tensor.device}, {tensor.layout}) was not pinned by pin_",
            cudaError.cudaErrorHostMemoryNotRegistered,
        )
    storage = tensor.untyped_storage()
    if storage.nbytes() == 0:
        return tensor  # pin_ locked nothing
    pin = _lookup(storage.data_ptr())
    if pin is None:
        raise PinError(
            f"unpin_: the storage at {storage.data_ptr():#x} was not pinned by pin_ (or was unpinned)",
            cudaError.cudaErrorHostMemoryNotRegistered,
        )
    code = pin.unregister()
    _forget(storage.data_ptr(), pin)
    if code != cudaError.success:
        raise PinError(f"unpin_: cudaHostUnregister failed: {code}: {_core.last_error().message}", code)
    return tensor


@contextlib.contextmanager
def pinned(*tensors: torch.Tensor, flags: int = HostRegisterFlags.Portable) -> Iterator[tuple[torch.Tensor, ...]]:
    """``with pinned(a, b): ...``: :func:`pin_` each tensor for the block, :func:`unpin_` them
    on leaving (also on an exception). When one cannot be pinned, the ones pinned before it
    are unpinned and the error is raised. A tensor given twice is pinned once; views of one
    another are refused, as :func:`pin_` refuses them."""
    done: list[torch.Tensor] = []
    try:
        for t in tensors:
            if any(t is d for d in done):
                continue
            pin_(t, flags)
            done.append(t)
        yield tensors
    finally:
        for t in reversed(done):
            with contextlib.suppress(PinError):  # unpinned inside the block already
                unpin_(t)


def is_pinned_by_hostreg(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s first byte lies in a live hostreg registration (``pin_``, a
    staging arena, the drop-in's ``cudaHostRegister``). About 0.2 us."""
    return registered_by_hostreg(tensor)
