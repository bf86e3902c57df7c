"""Typed Python face of the C core (``hostreg._hostreg``).

Addresses are plain ``int`` (as ``tensor.data_ptr()`` gives them); byte counts are ``int``
bytes. Arguments that are not integers raise ``TypeError``; integers out of range
(negative, or not below 2**64) raise ``ValueError``. Failures of the calls themselves are
returned as :class:`hostreg.cudaError` codes, never raised, as CUDA does.
"""

from __future__ import annotations

import enum
import logging
import operator
from typing import NamedTuple

from . import _hostreg
from ._errors import cudaError


class HostRegisterFlags(enum.IntFlag):
    """``cudaHostRegister`` flags (CUDA 13.0 ``cuda_runtime_api.h``)."""

    Default = 0x0
    Portable = 0x1
    Mapped = 0x2
    IoMemory = 0x4
    ReadOnly = 0x8


class Registration(NamedTuple):
    """One live registration."""

    base: int  #: address passed to host_register
    nbytes: int  #: byte count passed to host_register
    flags: HostRegisterFlags  #: flags passed to host_register
    device_ptr: int  #: device address of base (posix backend: base itself)
    backend: str  #: backend that locked it ("posix", "cuda", ...)


log = logging.getLogger("hostreg")
log.addHandler(logging.NullHandler())  # silent unless the application configures logging

# Failures that are the caller's (bad arguments, overlap, unknown pointer) log at DEBUG; the
# environment's (cannot lock, no backend, not supported) at WARNING.
_CALLERS = frozenset({1, 712, 713})
_announced = False


def _checked(call: str, code: int, caller_level: int = logging.DEBUG) -> cudaError:
    """cudaError of a C call's result, logging the backend once and every failure (the
    caller's own mistakes at ``caller_level``, the environment's at WARNING)."""
    global _announced
    if not _announced:
        _announced = True
        log.info("backend %s selected", _hostreg.backend_name())
    err = cudaError(code)
    if code:
        _, native, message = _hostreg.last_error()
        log.log(caller_level if code in _CALLERS else logging.WARNING, "%s: %s, native %d: %s", call, err, native, message)
    return err


_U64 = 1 << 64
_U32 = 1 << 32


def _uint(value: object, name: str, limit: int = _U64) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not bool")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name} must be an int, not {type(value).__name__}") from None
    if not 0 <= v < limit:
        raise ValueError(f"{name} must be in [0, {limit}), got {v}")
    return v


def _int32(value: object, name: str) -> int:
    """A non-negative C int argument (an error code): TypeError / ValueError otherwise."""
    return _uint(value, name, 1 << 31)


def host_register(ptr: int, nbytes: int, flags: int = 0) -> cudaError:
    """Page-lock ``nbytes`` bytes at address ``ptr`` (``cudaHostRegister``).

    Returns ``cudaError.success`` or the failure: ``cudaErrorInvalidValue`` (null pointer,
    0 bytes, wrap-around, unknown flag bits, unmapped memory), ``cudaErrorMemoryAllocation``
    (cannot lock, e.g. ``RLIMIT_MEMLOCK``), ``cudaErrorHostMemoryAlreadyRegistered`` (any
    byte already registered), ``cudaErrorNotSupported`` (flag the backend cannot honour).
    :func:`last_error` then says why. The GIL is released during the call.
    """
    return _register("cudaHostRegister", ptr, nbytes, flags, logging.DEBUG)


def _register(call: str, ptr: int, nbytes: int, flags: int, caller_level: int) -> cudaError:
    code = _hostreg.host_register(_uint(ptr, "ptr"), _uint(nbytes, "nbytes"), _uint(flags, "flags", _U32))
    return _checked(call, code, caller_level)


def host_unregister(ptr: int) -> cudaError:
    """Undo the registration based at ``ptr`` (``cudaHostUnregister``).

    Returns ``cudaError.success`` or ``cudaErrorHostMemoryNotRegistered`` when ``ptr`` is
    not the base of a live registration. The GIL is released during the call.
    """
    return _unregister("cudaHostUnregister", ptr, logging.DEBUG)


def _unregister(call: str, ptr: int, caller_level: int) -> cudaError:
    return _checked(call, _hostreg.host_unregister(_uint(ptr, "ptr")), caller_level)


def host_get_device_pointer(ptr: int, flags: int = 0) -> tuple[cudaError, int]:
    """``cudaHostGetDevicePointer``: (code, device address of registered host address ``ptr``)."""
    code, dev = _hostreg.host_get_device_pointer(_uint(ptr, "ptr"), _uint(flags, "flags", _U32))
    return cudaError(code), dev


def host_get_flags(ptr: int) -> tuple[cudaError, HostRegisterFlags]:
    """``cudaHostGetFlags``: (code, flags of the registration containing ``ptr``)."""
    code, flags = _hostreg.host_get_flags(_uint(ptr, "ptr"))
    return cudaError(code), HostRegisterFlags(flags)


def _reg(t: tuple[int, int, int, int, str]) -> Registration:
    return Registration(t[0], t[1], HostRegisterFlags(t[2]), t[3], t[4])


def registration(ptr: int) -> Registration | None:
    """The live registration containing address ``ptr``, or ``None``."""
    t = _hostreg.registration(_uint(ptr, "ptr"))
    return None if t is None else _reg(t)


def registrations() -> list[Registration]:
    """All live registrations of this process, in address order."""
    return [_reg(t) for t in _hostreg.registrations()]


class Stats(NamedTuple):
    registrations: int  #: live registrations
    bytes_registered: int  #: sum of their byte counts
    bytes_locked: int  #: bytes of the distinct whole pages they cover


def stats() -> Stats:
    """Process-wide counters of live registrations."""
    return Stats(*_hostreg.stats())


class LastError(NamedTuple):
    code: cudaError  #: the cudaError of the failure (success if none yet)
    native: int  #: the backend's own code (errno for posix), 0 if none
    message: str  #: human explanation


def last_error() -> LastError:
    """The calling thread's last failed hostreg call (``code`` is success if none)."""
    code, native, message = _hostreg.last_error()
    return LastError(cudaError(code), native, message)


def backend() -> str:
    """Name of the backend in use ("posix", ...), or "none" when registration is unavailable."""
    return _hostreg.backend_name()
