"""The staging memory of one state dict (:class:`Arena`) and the staged tensors in it."""

from __future__ import annotations

from typing import NoReturn

import torch

from .. import _core, _hostreg
from .._core import HostRegisterFlags
from .._errors import StagingError
from . import _sharing
from ._dtensor import wrap
from ._layout import Layout


def raise_last(what: str) -> NoReturn:
    """StagingError with the calling thread's last hostreg failure (the C core has logged it)."""
    err = _core.last_error()
    raise StagingError(f"{what}: {err.code}: {err.message}")


class Arena:
    """The staging memory of one state dict: ``nbytes`` bytes, every page allocated, and
    (optionally) registered once.

    - ``share=True``: an unnamed ``/dev/shm`` file (``$HOSTREG_SHM_DIR``), mapped shared, so
      the tensors reach another process without a copy (``torch.multiprocessing`` passes the
      file once per message, see ``_sharing.py``); else private anonymous memory.
    - Every page is allocated up front, in the kernel (``hostregPrepareMemory``): a full
      ``/dev/shm`` or a memory limit raises :class:`StagingError` naming it, its size and the
      bytes needed, never a SIGBUS later.
    - ``pin=True``: registered through the active backend (in chunks of at most
      ``max_chunk_bytes``, 0 = the backend's cap) with ``flags``. A failure (e.g.
      ``RLIMIT_MEMLOCK``) raises :class:`StagingError` with hostreg's reason.

    All of it is one ``_hostreg.StagingBuffer``, made whole or not at all: an exception at any
    point, a ``KeyboardInterrupt`` included, leaves nothing allocated, locked or registered.
    The registration is undone by :meth:`close`, or when this object and every tensor of it are
    gone (each tensor's storage holds the buffer).
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
        if nbytes >= 1 << 64:  # no size_t holds it: the same failure the C core gives a size it cannot map
            raise StagingError(
                f"cannot stage {nbytes:,} bytes of staging memory: cudaErrorMemoryAllocation (2): more than a "
                "64-bit address space holds (2**64 bytes)"
            )
        code, buf = _hostreg.staging_buffer_create(max(nbytes, 1), share, pin, int(flags), max_chunk_bytes)
        if code != 0 or buf is None:
            raise_last(f"cannot {'register' if code in (712, 801) else 'stage'} {nbytes:,} bytes of staging memory")
        self.buffer = buf
        self.chunks = buf.chunks
        _sharing.track()

    @staticmethod
    def check_room(nbytes: int, *, pin: bool = True, share: bool = True) -> None:
        """Raise the :class:`StagingError` that ``Arena(nbytes, pin=pin, share=share)`` would
        raise for lack of room (the shared-memory directory's free space; ``RLIMIT_MEMLOCK``
        where the backend locks pages with ``mlock``), before any memory is made; return None
        when the room is there (making the arena may still fail later)."""
        if nbytes >= 1 << 64:
            Arena(nbytes, pin=pin, share=share)  # raises: the one message for sizes no size_t holds
        if _hostreg.staging_buffer_room(max(nbytes, 1), share, pin) != 0:
            raise_last(f"cannot stage {nbytes:,} bytes of staging memory")

    @property
    def data_ptr(self) -> int:
        """Address of the arena's first byte (page-aligned)."""
        return self.buffer.data_ptr

    def view(self, offset: int, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous tensor of ``shape`` and ``dtype`` at byte ``offset`` of the arena, with a
        storage of its own holding exactly its bytes, which keeps the arena alive."""
        return _sharing.tensor_view(self.buffer, offset, shape, dtype)

    def span_storages(self, layout: Layout) -> list[torch.UntypedStorage]:
        """One storage per span of ``layout``, each holding exactly the span's bytes."""
        return [
            _sharing.storage_view(self.buffer, off, n)
            for off, (_, n) in zip(layout.span_offsets, layout.grouping.spans)
        ]

    def close(self) -> None:
        """Undo the registration now (views stay valid, no longer page-locked). Idempotent."""
        self.buffer.unregister()


def leaves_on(storages: list[torch.UntypedStorage], layout: Layout) -> list[torch.Tensor]:
    """New tensor objects for every leaf of ``layout`` over its span storages (DTensor leaves
    wrapped again with their mesh, placements, global shape and strides)."""
    out: list[torch.Tensor] = []
    g = layout.grouping
    for i, meta in enumerate(layout.leaves):
        span = g.group[i]
        if span < 0:
            t = torch.empty(meta.shape, dtype=meta.dtype)
        else:
            t = torch.empty(0, dtype=meta.dtype).set_(
                storages[span], g.offset[i] // meta.dtype.itemsize, meta.shape, meta.stride
            )
        if meta.dtensor is not None:
            t = wrap(t, meta.dtensor)
        out.append(t)
    return out
