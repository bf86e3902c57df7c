"""hostreg: real page-locked host memory through CUDA's cudaHostRegister interface.

Every success means the range really is page-locked: by the accelerator runtime, or on a
host without one by the OS (``mlock``; the ``posix`` backend). Codes are CUDA's
``cudaError`` numbers.

Main entry points:

- :func:`cudart` -- a process-wide drop-in for ``torch._C._cudart``.
- :func:`host_register` / :func:`host_unregister` -- the same calls, returning
  :class:`cudaError`.
- :mod:`hostreg.torch` -- ``install()`` makes ``torch.cuda.cudart()`` fall back to hostreg.
"""

from __future__ import annotations

from ._core import (
    HostRegisterFlags,
    LastError,
    Registration,
    Stats,
    backend,
    host_get_device_pointer,
    host_get_flags,
    host_register,
    host_unregister,
    last_error,
    registration,
    registrations,
    set_default_device,
    stats,
)
from ._cudart import CudaRuntime, cudart
from ._errors import HostregError, StagingError, cudaError
from ._hostreg import version as _library_version
from ._proc import locked_bytes

__version__: str = (
    _library_version()
)  #: the C library's (CMakeLists.txt's project version, the one place it is written)

__all__ = [
    "CudaRuntime",
    "HostRegisterFlags",
    "HostregError",
    "LastError",
    "Registration",
    "StagingError",
    "Stats",
    "backend",
    "cudaError",
    "cudart",
    "host_get_device_pointer",
    "host_get_flags",
    "host_register",
    "host_unregister",
    "last_error",
    "locked_bytes",
    "registration",
    "registrations",
    "set_default_device",
    "stats",
]
