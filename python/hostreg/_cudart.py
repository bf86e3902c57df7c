"""``hostreg.cudart()``: a drop-in for ``torch._C._cudart`` backed by hostreg.

It offers what ``torch/csrc/cuda/shared/cudart.cpp`` binds (see ``docs/pytorch.md``): ``cudaError``, ``cudaGetErrorString``,
``cudaHostRegister`` / ``cudaHostUnregister`` (really page-locking, GIL released),
and for the calls hostreg cannot serve (profiler, streams, ``cudaMemGetInfo``) an honest
``cudaErrorNotSupported`` answer, never a fake success.
"""

from __future__ import annotations

import os
import sys
import threading

from . import _core, _hostreg
from ._errors import cudaError as _CudaError

_told = False
_told_lock = threading.Lock()


def _tell_first_refusal(size: int) -> None:
    """The process's first registration refused through the drop-in, said once on stderr with
    hostreg's reason: PyTorch shows only its own words for a ``cudaError`` (an "asynchronous
    error ... CUDA_LAUNCH_BLOCKING" message, or a failed assertion), and the reason (a memlock
    limit, say) is in hostreg's log, silent by default. Not said when ``HOSTREG_LOG_LEVEL`` is
    set: the log then says what it was asked to (``off``: nothing). docs/environment.md."""
    global _told
    if os.environ.get("HOSTREG_LOG_LEVEL"):
        return
    err = _core.last_error()  # this thread's, before anything else can replace it
    with _told_lock:
        if _told:
            return
        _told = True
    print(
        f"hostreg: cudaHostRegister of {size:,} bytes through hostreg's drop-in failed: {err.code}: "
        f"{err.message} (said once; HOSTREG_LOG_LEVEL=warning says every failure, HOSTREG_LOG_LEVEL=off none)",
        file=sys.stderr,
        flush=True,
    )


class CudaRuntime:
    """The object :func:`cudart` returns; mirrors ``torch._C._cudart``.

    There is one per process. Its methods take and return plain ints / :class:`cudaError`
    as torch's do; they never raise for a failed call (they return the code), only for
    arguments of the wrong type (``TypeError``) or range (``ValueError``).
    """

    cudaError = _CudaError

    # One crossing into the C core per call. Failures through here are logged (by the C core,
    # through hostreg's logger) at WARNING with hostreg's reason, whoever's fault they are:
    # torch turns the code into a RuntimeError that blames an asynchronous CUDA error.
    @staticmethod
    def cudaHostRegister(ptr: int, size: int, flags: int) -> _CudaError:  # noqa: N802
        """Page-lock ``size`` bytes at address ``ptr``; see :func:`hostreg.host_register`."""
        _core.note_caller_device()  # DCP pins on its staging thread: torch_npu may know the device there
        code = _hostreg.host_register(ptr, size, flags, "cudart().cudaHostRegister (hostreg's drop-in)")
        if code != 0:
            _tell_first_refusal(size)
        return _CudaError(code)

    @staticmethod
    def cudaHostUnregister(ptr: int) -> _CudaError:  # noqa: N802
        """Undo the registration based at ``ptr``; see :func:`hostreg.host_unregister`."""
        return _CudaError(_hostreg.host_unregister(ptr, "cudart().cudaHostUnregister (hostreg's drop-in)"))

    @staticmethod
    def cudaGetErrorString(error: int) -> str:  # noqa: N802
        """CUDA's message for a code ("invalid argument"), or "unrecognized error code"."""
        return _hostreg.error_string(error)

    @staticmethod
    def cudaGetErrorName(error: int) -> str:  # noqa: N802
        """CUDA's name for a code ("cudaErrorInvalidValue"), or "unrecognized error code"."""
        return _hostreg.error_name(error)

    # The calls below need a CUDA device; hostreg has none to offer, so it says so.
    @staticmethod
    def cudaProfilerStart() -> _CudaError:  # noqa: N802
        """Not supported without CUDA: returns ``cudaErrorNotSupported``."""
        return _CudaError.cudaErrorNotSupported

    @staticmethod
    def cudaProfilerStop() -> _CudaError:  # noqa: N802
        """Not supported without CUDA: returns ``cudaErrorNotSupported``."""
        return _CudaError.cudaErrorNotSupported

    @staticmethod
    def cudaStreamCreate(ptr: int) -> _CudaError:  # noqa: N802
        """Not supported without CUDA: returns ``cudaErrorNotSupported``."""
        return _CudaError.cudaErrorNotSupported

    @staticmethod
    def cudaStreamDestroy(ptr: int) -> _CudaError:  # noqa: N802
        """Not supported without CUDA: returns ``cudaErrorNotSupported``."""
        return _CudaError.cudaErrorNotSupported

    @staticmethod
    def cudaMemGetInfo(device: int) -> tuple[int, int]:  # noqa: N802
        """Raises ``RuntimeError`` (as torch's does on error): hostreg manages no device memory."""
        raise RuntimeError(
            f"cudaMemGetInfo({device}): {_CudaError.cudaErrorNotSupported}: hostreg "
            f"({_core.backend()} backend) page-locks host memory and has no device memory to report"
        )

    def __repr__(self) -> str:
        return f"<hostreg.cudart backend={_core.backend()!r}>"


_instance = CudaRuntime()


def cudart() -> CudaRuntime:
    """The process-wide :class:`CudaRuntime` (always the same object)."""
    return _instance
