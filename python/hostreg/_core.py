"""Typed Python face of the C core (``hostreg._hostreg``).

Addresses are plain ``int`` (as ``tensor.data_ptr()`` gives them); byte counts are ``int``
bytes. Arguments that are not integers raise ``TypeError``; integers out of range
(negative, or not below 2**64) raise ``ValueError``. Failures of the calls themselves are
returned as :class:`hostreg.cudaError` codes, never raised, as CUDA does.
"""

from __future__ import annotations

import enum
import logging
import sys
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

_LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING)  # HOSTREG_LOG_DEBUG, _INFO, _WARNING


def _on_log(level: int, call: str, code: int, native: int, message: str, label: str | None) -> None:
    """The C core's diagnostics (``hostregSetLogHandler``), each event once, into ``log``.

    The C core gives the level by its one rule (the caller's mistakes 1, 712, 713 at DEBUG,
    the environment's failures at WARNING, backend selection at INFO). A failure of a call the
    drop-in made for torch (``label``) is a WARNING whoever's fault: torch turns its code into
    a RuntimeError that blames an asynchronous CUDA error, so this line is the only reason given.
    Must not call hostreg (the C core may be choosing its backend)."""
    py_level = _LEVELS[level] if 0 <= level < len(_LEVELS) else logging.WARNING
    if code and label is not None:
        py_level = logging.WARNING
    if not log.isEnabledFor(py_level):
        return
    # The C core's own format (hostregFormatLogEvent), the label naming a failed call for torch.
    log.log(py_level, "%s", _hostreg.format_log_event((label or call) if code else call, code, native, message))


class _CStyle(logging.Formatter):
    """``hostreg <level>: <message>``, the C core's own stderr format."""

    def format(self, record: logging.LogRecord) -> str:
        return f"hostreg {record.levelname.lower()}: {record.getMessage()}"


def _log_from_environment() -> None:
    """``HOSTREG_LOG_LEVEL`` (debug, info, warning) in a Python process: the same lines on stderr
    as the C core writes without Python, from this logger (then not propagated, so that a
    root handler does not print them twice)."""
    level = _hostreg.log_level_from_environment()  # read (and an unknown value said) by the C core
    if level < 0:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(_CStyle())
    log.addHandler(handler)
    log.setLevel(_LEVELS[level])
    log.propagate = False


_log_from_environment()
_hostreg.set_log_sink(_on_log)


def host_register(ptr: int, nbytes: int, flags: int = 0) -> cudaError:
    """Page-lock ``nbytes`` bytes at address ``ptr`` (``cudaHostRegister``).

    Returns ``cudaError.success`` or the failure: ``cudaErrorInvalidValue`` (null pointer,
    0 bytes, wrap-around, unknown flag bits, unmapped memory), ``cudaErrorMemoryAllocation``
    (cannot lock, e.g. ``RLIMIT_MEMLOCK``), ``cudaErrorHostMemoryAlreadyRegistered`` (any
    byte already registered), ``cudaErrorNotSupported`` (flag the backend cannot honour).
    :func:`last_error` then says why. The GIL is released during the call. ``TypeError`` for an
    argument that is not an int, ``ValueError`` for one out of range (below 0, or not below
    2**64; flags 2**32).
    """
    return cudaError(_hostreg.host_register(ptr, nbytes, flags))


def host_unregister(ptr: int) -> cudaError:
    """Undo the registration based at ``ptr`` (``cudaHostUnregister``).

    Returns ``cudaError.success`` or ``cudaErrorHostMemoryNotRegistered`` when ``ptr`` is
    not the base of a live registration. The GIL is released during the call.
    """
    return cudaError(_hostreg.host_unregister(ptr))


def host_get_device_pointer(ptr: int, flags: int = 0) -> tuple[cudaError, int]:
    """``cudaHostGetDevicePointer``: (code, device address of registered host address ``ptr``)."""
    code, dev = _hostreg.host_get_device_pointer(ptr, flags)
    return cudaError(code), dev


def host_get_flags(ptr: int) -> tuple[cudaError, HostRegisterFlags]:
    """``cudaHostGetFlags``: (code, flags of the registration containing ``ptr``)."""
    code, flags = _hostreg.host_get_flags(ptr)
    return cudaError(code), HostRegisterFlags(flags)


def _reg(r: _hostreg.RegistrationRecord) -> Registration:
    return Registration(r.base, r.nbytes, HostRegisterFlags(r.flags), r.device_ptr, r.backend)


def registration(ptr: int) -> Registration | None:
    """The live registration containing address ``ptr``, or ``None``."""
    t = _hostreg.registration(ptr)
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


def set_default_device(device: int | None = None) -> cudaError:
    """The device that registrations made on threads without a current device context of their
    own are for (``hostregSetDefaultDevice``): ``device``, or with None the calling thread's
    current device as its runtime says.

    Matters for AscendCL, whose contexts are per thread: a staging thread has none, and the
    acl backend then registers for this device (learned, without this call, from the first
    thread that used hostreg with a context; with neither it refuses with
    ``cudaErrorDeviceUninitialized`` instead of guessing NPU 0). The other backends accept and
    ignore it (posix and ze register for no one device; cuda, hip and musa use their runtime's
    current device, 0 on a thread that chose none, as CUDA's runtime does). Returns ``cudaError.success``, ``cudaErrorInvalidDevice`` for a device the
    runtime does not have, ``cudaErrorDeviceUninitialized`` for None on a thread without a
    context; raises ValueError for a negative ``device``.
    """
    global _device_noted
    if device is not None and (isinstance(device, bool) or not isinstance(device, int) or not 0 <= device < 2**31):
        raise ValueError(f"device must be an int from 0 to 2**31 - 1, or None; got {device!r}")
    code = cudaError(_hostreg.set_default_device(-1 if device is None else device))
    _device_noted |= code == cudaError.success
    return code


_device_noted = False


def note_caller_device() -> None:
    """Tells the C core this process's device from the calling thread, once it can: the
    thread's current device context (its runtime's answer), else, where torch_npu is loaded
    and initialised, ``torch.npu.current_device()`` (torch_npu's own choice for a thread
    without a context). Called where hostreg is about to register anyway (``Stager.stage()`` on
    the caller's thread, the drop-in's ``cudaHostRegister``), never at import or install time:
    it selects and initialises the backend's runtime, which must not come before the user's
    own (torch_npu's ``aclInit``). So registrations made later on staging threads are for the
    device the process uses (:func:`set_default_device`). Never raises."""
    global _device_noted
    if _device_noted:
        return
    if _hostreg.set_default_device(-1) == 0:
        _device_noted = True
        return
    torch = sys.modules.get("torch") if "torch_npu" in sys.modules else None
    npu = getattr(torch, "npu", None)
    try:
        if npu is not None and npu.is_initialized():
            _device_noted = _hostreg.set_default_device(int(npu.current_device())) == 0
    except Exception:  # noqa: BLE001 -- torch_npu's answer is a hint; without it the core refuses clearly
        pass


def backend() -> str:
    """Name of the backend in use ("posix", ...), or "none" when registration is unavailable."""
    return _hostreg.backend_name()
