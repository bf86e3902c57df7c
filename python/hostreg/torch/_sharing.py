"""Staged tensors: a storage of their own inside the arena, and passing arenas between processes.

Every staged tensor is a view of its arena's memory with a storage holding exactly its bytes:
the extension hands torch a DLPack capsule of those bytes (``_hostreg.bytes_view``) whose
deleter drops a reference to the arena's ``StagingBuffer``, so the memory lives as long as
any tensor of it. That is what PyTorch's own consumers need: ``torch.save`` writes whole
storages (and refuses storages viewed as two dtypes), and DCP's ``FileSystemWriter`` clones any
CPU tensor whose storage is larger than the tensor (torch/distributed/checkpoint/filesystem.py).

torch would copy such a tensor into new shared memory when a ``torch.multiprocessing`` pickler
sends it (its storage is not one torch allocated shared). So hostreg registers its own
reducers for tensors with ``multiprocessing.reduction.ForkingPickler``: a tensor inside a
shared arena is sent as (arena, offset, shape, dtype, stride), and the arena itself as a
duplicate of its file descriptor, once per message however many tensors view it (the
pickler's memo). The receiving process maps the same file (``StagingBuffer`` attach) and
rebuilds the tensors over it, storage sharing included; a storage of an arena is sent the
same way. Any other tensor or storage goes to torch's own reducer unchanged, and so do
tensors torch refuses to send (a non-leaf that requires grad, a named tensor).

Limits, as with torch's own ``file_descriptor`` strategy: when a message fails to pickle after
an arena was reduced, the descriptor duplicated for the receiver stays with
``multiprocessing``'s resource sharer (and the arena's memory with it) until this process
exits. ``Tensor.share_memory_()`` on a staged tensor moves it out of the arena into memory of
torch's (``is_shared()`` is False for staged tensors: torch does not know the arena's memory);
staged tensors need no ``share_memory_()``, they are shared already.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import torch

from .. import _hostreg
from .._errors import HostregError
from .._hostreg import StagingBuffer

# Which staging buffer (the C core's memory beneath an :class:`Arena`) an address lies in is
# answered by the C core (``hostregStagingBufferFind``, through ``_hostreg.staging_buffer_of``),
# whose index of live buffers changes only inside C calls, and is held across fork(): no Python
# exception (a KeyboardInterrupt), garbage collection or fork() finds it half-updated or
# locked. The lock here guards only the one-time install of the reducers.
_lock = threading.Lock()
_installed = False
_torch_reducers: dict[type, Any] = {}


def _after_fork_in_child() -> None:
    # Another thread of the parent may have held the lock at fork(): it is never released here.
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def staging_buffer_of(t: torch.Tensor) -> StagingBuffer | None:
    """The staging buffer (``_hostreg.StagingBuffer``, the memory of an arena) that tensor ``t``
    lies in, or None."""
    if t.device.type != "cpu" or t.layout != torch.strided:
        return None
    try:
        st = t.untyped_storage()
        ptr, nbytes = st.data_ptr(), st.nbytes()
    except (RuntimeError, NotImplementedError):  # no real storage (a fake or functional tensor)
        return None
    return _hostreg.staging_buffer_of(ptr, nbytes) if nbytes else None


def storage_view(buf: StagingBuffer, offset: int, nbytes: int) -> torch.UntypedStorage:
    """A storage of exactly ``nbytes`` bytes at byte ``offset`` of ``buf`` (keeping it alive)."""
    return torch.from_dlpack(_hostreg.bytes_view(buf, buf.data_ptr + offset, nbytes)).untyped_storage()


def tensor_view(
    buf: StagingBuffer, offset: int, shape: torch.Size | tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """A contiguous tensor of ``shape`` and ``dtype`` at byte ``offset`` of ``buf``, with a
    storage of its own (empty tensors: an empty one of their own, no bytes of the arena)."""
    numel = 1
    for n in shape:
        numel *= n
    nbytes = numel * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    raw = torch.from_dlpack(_hostreg.bytes_view(buf, buf.data_ptr + offset, nbytes))  # uint8[nbytes]
    return raw.view(dtype).view(shape)


# ---- torch.multiprocessing ----------------------------------------------------------------


def _reduce_buffer(buf: StagingBuffer) -> tuple:
    from multiprocessing.reduction import DupFd

    return (_attach, (DupFd(buf.fd), buf.size))


def _attach(dup: Any, size: int) -> StagingBuffer:
    """The receiving side of :func:`_reduce_buffer`: the same file, mapped here."""
    code, buf = _hostreg.staging_buffer_attach(dup.detach(), size)
    if code != 0 or buf is None:
        _, native, message = _hostreg.last_error()
        raise HostregError(f"hostreg: cannot map a staging arena passed from another process: {message}")
    install_reducers()
    return buf


def _named(t: torch.Tensor) -> bool:
    has_names = getattr(t, "has_names", None)  # named tensors: gone from newer torch
    return bool(has_names is not None and has_names())


def _reduce_tensor(t: torch.Tensor) -> tuple:
    # What torch refuses to send (a non-leaf that requires grad, a named tensor), it refuses.
    if type(t) in (torch.Tensor, torch.nn.Parameter) and not (t.requires_grad and not t.is_leaf) and not _named(t):
        buf = staging_buffer_of(t)
        if buf is not None and buf.fd >= 0:  # shared memory: sent by file
            st = t.untyped_storage()
            meta = (st.data_ptr() - buf.data_ptr, st.nbytes(), t.dtype, tuple(t.shape), t.stride(), t.storage_offset())
            return (_rebuild_tensor, (buf, meta, t.requires_grad, isinstance(t, torch.nn.Parameter)))
    return _torch_reducers[type(t)](t)


# Storages rebuilt in this process, per arena buffer and byte range, so that tensors sharing one
# storage (tied weights, views) share one again after a message (kept while any is alive).
_rebuilt: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _storage_at(buf: StagingBuffer, offset: int, nbytes: int) -> torch.UntypedStorage:
    storages = _rebuilt.setdefault(buf, weakref.WeakValueDictionary())  # entries live with their tensors
    storage = storages.get((offset, nbytes))
    if storage is None:
        storage = storage_view(buf, offset, nbytes)
        storages[(offset, nbytes)] = storage
    return storage


def _rebuild_tensor(buf: StagingBuffer, meta: tuple, requires_grad: bool, parameter: bool) -> torch.Tensor:
    offset, nbytes, dtype, shape, stride, storage_offset = meta
    storage = _storage_at(buf, offset, nbytes)
    t = torch.empty(0, dtype=dtype).set_(storage, storage_offset, shape, stride)
    if parameter:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    t.requires_grad_(requires_grad)
    return t


def _reduce_storage(st: torch.UntypedStorage) -> tuple:
    """A storage inside a shared arena goes by file, as its tensors do (torch's reducer would
    copy it into new shared memory and move it out of the arena)."""
    if st.device.type == "cpu" and st.nbytes():
        buf = _hostreg.staging_buffer_of(st.data_ptr(), st.nbytes())
        if buf is not None and buf.fd >= 0:
            return (_storage_at, (buf, st.data_ptr() - buf.data_ptr, st.nbytes()))
    return _torch_reducers[torch.UntypedStorage](st)


def install_reducers() -> None:
    """Register the reducers (once, after torch's own: ``import torch.multiprocessing``): from
    then on, a tensor in a shared arena goes to another process as its arena's file. Called for
    every new or attached arena."""
    global _installed
    if _installed:
        return
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 -- registers torch's reducers first

    with _lock:
        if _installed:
            return
        for cls in (torch.Tensor, torch.nn.Parameter):
            _torch_reducers[cls] = ForkingPickler._extra_reducers[cls]  # type: ignore[attr-defined]
            ForkingPickler.register(cls, _reduce_tensor)
        # Typed storages reduce to their untyped storage, which then comes here.
        _torch_reducers[torch.UntypedStorage] = ForkingPickler._extra_reducers[torch.UntypedStorage]  # type: ignore[attr-defined]
        ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
        ForkingPickler.register(_hostreg.StagingBuffer, _reduce_buffer)
        _installed = True
