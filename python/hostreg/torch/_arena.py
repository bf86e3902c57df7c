"""The staging memory of one state dict (:class:`Arena`) and the staged tensors in it."""

from __future__ import annotations

from collections import Counter
from typing import NoReturn

import torch

from .. import _core, _hostreg
from .._core import HostRegisterFlags
from .._errors import StagingError
from . import _sharing
from ._dtensor import wrap
from ._layout import Layout, beyond_address_space


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
            raise beyond_address_space(nbytes)
        code, buf = _hostreg.staging_buffer_create(max(nbytes, 1), share, pin, int(flags), max_chunk_bytes)
        if code != 0 or buf is None:
            raise_last(f"cannot {'register' if code in (712, 801) else 'stage'} {nbytes:,} bytes of staging memory")
        self.buffer = buf
        self.chunks = buf.chunks
        _sharing.install_reducers()

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

    def staged_leaves(self, layout: Layout) -> tuple[list[torch.UntypedStorage], list[torch.Tensor]]:
        """(one storage per span of ``layout``, each holding exactly the span's bytes; every
        leaf of ``layout`` over them, as :func:`leaves_on` makes them). A leaf alone in its span
        from the span's first byte, of a dtype DLPack names, is made directly over the arena
        (one DLPack view of its dtype, shape and strides, all made in one call), and its
        storage is the span's; the others are views of their span's storage."""
        g = layout.grouping
        count = Counter(g.group)
        direct = [
            i
            for i, (s, off, meta) in enumerate(zip(g.group, g.offset, layout.leaves))
            if s >= 0 and off == 0 and count[s] == 1 and meta.dtype in _DLPACK
        ]
        storages: list[torch.UntypedStorage | None] = [None] * len(g.spans)
        leaves: list[torch.Tensor | None] = [None] * len(g.group)
        if direct:
            base = self.buffer.data_ptr
            metas = [layout.leaves[i] for i in direct]
            caps = _hostreg.typed_views(
                self.buffer,
                [base + layout.span_offsets[g.group[i]] for i in direct],
                [_DLPACK[m.dtype] for m in metas],
                [m.shape for m in metas],
                [m.stride for m in metas],
            )
            for i, t in zip(direct, map(torch.from_dlpack, caps)):
                leaves[i] = t
                storages[g.group[i]] = t.untyped_storage()
        spans = [
            st if st is not None else _sharing.storage_view(self.buffer, off, n)
            for st, off, (_, n) in zip(storages, layout.span_offsets, g.spans)
        ]
        made = [leaf_on(spans, layout, i) if t is None else t for i, t in enumerate(leaves)]
        for i in direct:
            placement = layout.leaves[i].dtensor
            if placement is not None:
                made[i] = wrap(made[i], placement)
        return spans, made

    def close(self) -> None:
        """Undo the registration now (views stay valid, no longer page-locked). Idempotent."""
        self.buffer.unregister()


def leaves_on(storages: list[torch.UntypedStorage], layout: Layout) -> list[torch.Tensor]:
    """New tensor objects for every leaf of ``layout`` over its span storages (DTensor leaves
    wrapped again with their mesh, placements, global shape and strides)."""
    return [leaf_on(storages, layout, i) for i in range(len(layout.leaves))]


def leaf_on(storages: list[torch.UntypedStorage], layout: Layout, i: int) -> torch.Tensor:
    """A new tensor object for leaf ``i`` of ``layout`` over its span's storage."""
    meta = layout.leaves[i]
    span = layout.grouping.group[i]
    if span < 0:
        t = torch.empty(meta.shape, dtype=meta.dtype)
    else:
        t = torch.empty(0, dtype=meta.dtype).set_(
            storages[span], layout.grouping.offset[i] // meta.dtype.itemsize, meta.shape, meta.stride
        )
    return wrap(t, meta.dtensor) if meta.dtensor is not None else t


# torch dtypes as DLPack's (code | bits << 8) (dlpack.h: kDLInt 0, kDLUInt 1, kDLFloat 2,
# kDLBfloat 4, kDLComplex 5), the ones every torch >= 2.4 takes from a capsule; the others
# (bool, float8, the unsigned types wider than 8 bits) are made with set_.
_DLPACK = {
    torch.int8: 0 | 8 << 8,
    torch.int16: 0 | 16 << 8,
    torch.int32: 0 | 32 << 8,
    torch.int64: 0 | 64 << 8,
    torch.uint8: 1 | 8 << 8,
    torch.float16: 2 | 16 << 8,
    torch.float32: 2 | 32 << 8,
    torch.float64: 2 | 64 << 8,
    torch.bfloat16: 4 | 16 << 8,
    torch.complex64: 5 | 64 << 8,
    torch.complex128: 5 | 128 << 8,
}
