"""``cudaError``: CUDA's error numbers as an ``IntEnum`` that reads well.

Numbers and names are CUDA's (CUDA 13.0 ``driver_types.h``; see
``shared/reference/vendor-abi.md``); the C core's table (``hostregGetErrorName``) is the
source of truth and a test keeps the two equal.

A member works everywhere torch's ``torch._C._cudart.cudaError`` does: ``int(r)``,
``r == 0``, ``r != 0``, ``r.value``, ``r == cudaError.success``. Unlike torch's (PyTorch
#132089, printed as ``cudaError.???``), ``str(r)`` and f-strings give the name and number:
``cudaErrorHostMemoryAlreadyRegistered (712)``.
"""

from __future__ import annotations

import enum


class cudaError(enum.IntEnum):  # noqa: N801 -- CUDA's and torch's name
    success = 0  #: torch._C._cudart.cudaError's only member; CUDA's cudaSuccess
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInitializationError = 3
    cudaErrorCudartUnloading = 4
    cudaErrorStubLibrary = 34
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorHostMemoryAlreadyRegistered = 712
    cudaErrorHostMemoryNotRegistered = 713
    cudaErrorNotPermitted = 800
    cudaErrorNotSupported = 801
    cudaErrorUnknown = 999

    @property
    def cuda_name(self) -> str:
        """CUDA's name: ``cudaSuccess``, ``cudaErrorInvalidValue``, ..."""
        return "cudaSuccess" if self.value == 0 else self.name

    def __str__(self) -> str:
        return f"{self.cuda_name} ({self.value})"

    def __format__(self, spec: str) -> str:
        # Numeric format specs ("d", "04x", ...) format the number; "" and "s" the text.
        if spec and spec[-1] in "bcdoxXn":
            return int.__format__(self.value, spec)
        return format(str(self), spec)


class StagingError(RuntimeError):
    """Staging could not be done or verified; the message names the cause and the limit
    (``RLIMIT_MEMLOCK``, ``/dev/shm`` size, ...). Nothing is left allocated or locked."""
