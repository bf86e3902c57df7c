"""CUDA, asked directly (through ctypes), to judge what hostreg says.

``Runtime``: the real CUDA runtime (libcudart): ``cudaHostRegister``/``cudaHostUnregister`` for
the differential cases, and ``cudaPointerGetAttributes``/``cudaHostGetFlags`` to see what
hostreg registered. ``DriverDouble`` (``--dry-run``, no GPU): the CUDA driver test double
(tests/doubles/cuda_driver_double.cpp) through the driver API it implements (cuda.h:
``cuMemHostRegister_v2``, ``cuMemHostGetFlags``, ...); it is the very file hostreg's cuda
backend loaded, so it knows hostreg's registrations. Not NVIDIA's library.
"""

from __future__ import annotations

import ctypes
import glob
import os
import site
import sys
import time
from pathlib import Path
from typing import Any, Callable

MEMORY_TYPE_HOST = 1  # enum cudaMemoryType (driver_types.h): Unregistered 0, Host 1, Device 2, Managed 3


class PointerAttributes(ctypes.Structure):
    # struct cudaPointerAttributes (cuda_runtime_api.h): type, device, devicePointer,
    # hostPointer; CUDA 13 adds fields after them, hence the padding.
    _fields_ = [
        ("type", ctypes.c_int),
        ("device", ctypes.c_int),
        ("devicePointer", ctypes.c_void_p),
        ("hostPointer", ctypes.c_void_p),
        ("_pad", ctypes.c_long * 16),
    ]


def _candidates(torch: Any) -> list[str]:
    """libcudart, best first: the one torch loaded, torch's lib, the nvidia wheels, the loader's names."""
    found = []
    with open("/proc/self/maps") as f:
        found += [line.split()[-1] for line in f if "libcudart.so" in line]
    found += sorted(glob.glob(str(Path(torch.__file__).parent / "lib" / "libcudart*.so*")))
    for root in dict.fromkeys(r for r in [*site.getsitepackages(), *sys.path] if r):
        found += sorted(glob.glob(os.path.join(root, "nvidia/*/lib/libcudart.so*")))
    major = (getattr(torch.version, "cuda", None) or "").split(".")[0]
    return list(
        dict.fromkeys([*found, *([f"libcudart.so.{major}"] if major else []), "libcudart.so.13", "libcudart.so.12"])
    )


class Runtime:
    """The real CUDA runtime, device 0 current."""

    def __init__(self, torch: Any) -> None:
        torch.cuda.init()
        errors = []
        for cand in _candidates(torch):
            try:
                lib = ctypes.CDLL(cand)
                lib.cudaHostRegister  # noqa: B018 (a runtime, not some other file)
                break
            except (OSError, AttributeError) as e:
                errors.append(f"{cand}: {e}")
        else:
            raise RuntimeError("no CUDA runtime (libcudart) found: " + "; ".join(errors[-4:]))
        vp, u = ctypes.c_void_p, ctypes.c_uint
        for name, args in {
            "cudaSetDevice": [ctypes.c_int],
            "cudaFree": [vp],
            "cudaGetLastError": [],
            "cudaHostRegister": [vp, ctypes.c_size_t, u],
            "cudaHostUnregister": [vp],
            "cudaHostGetFlags": [ctypes.POINTER(u), vp],
            "cudaPointerGetAttributes": [ctypes.POINTER(PointerAttributes), vp],
            "cudaRuntimeGetVersion": [ctypes.POINTER(ctypes.c_int)],
        }.items():
            getattr(lib, name).argtypes, getattr(lib, name).restype = args, ctypes.c_int
        self.lib, self.path, self.torch = lib, cand, torch
        # A current context first: device 0, its primary context made by the classic cudaFree(0).
        for what, r in (("cudaSetDevice(0)", lib.cudaSetDevice(0)), ("cudaFree(0)", lib.cudaFree(None))):
            if r:
                raise RuntimeError(f"{what} failed: {r}")
        v = ctypes.c_int()
        lib.cudaRuntimeGetVersion(ctypes.byref(v))
        self.describe = f"{cand} (runtime {v.value // 1000}.{v.value % 1000 // 10})"

    def _done(self, r: int) -> int:
        if r:  # a failure is also the runtime's sticky last error, which torch would report as its own
            self.lib.cudaGetLastError()
        return r

    def register(self, ptr: int, nbytes: int, flags: int) -> int:
        return self._done(self.lib.cudaHostRegister(ptr, nbytes, flags))

    def unregister(self, ptr: int) -> int:
        return self._done(self.lib.cudaHostUnregister(ptr))

    def memory_type(self, ptr: int) -> tuple[int, int, int]:
        """(code, cudaMemoryType, device pointer) from cudaPointerGetAttributes."""
        a = PointerAttributes()
        r = self._done(self.lib.cudaPointerGetAttributes(ctypes.byref(a), ptr))
        return (r, a.type, a.devicePointer or 0) if r == 0 else (r, 0, 0)

    def host_flags(self, ptr: int) -> tuple[int, int]:
        flags = ctypes.c_uint()
        return self._done(self.lib.cudaHostGetFlags(ctypes.byref(flags), ptr)), flags.value

    def is_pinned(self, t: Any) -> bool:
        return bool(t.is_pinned())

    def seconds(self, fn: Callable[[], None]) -> float:
        """Device time of the copies fn queues (CUDA events)."""
        cuda = self.torch.cuda
        cuda.synchronize()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


class DriverDouble:
    """Dry run: the CUDA driver test double at ``path``, context of device 0 current."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        vp = ctypes.c_void_p
        lib.cuMemHostRegister_v2.argtypes = [vp, ctypes.c_size_t, ctypes.c_uint]
        lib.cuMemHostUnregister.argtypes = [vp]
        lib.cuMemHostGetFlags.argtypes = [ctypes.POINTER(ctypes.c_uint), vp]
        lib.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), vp, ctypes.c_uint]
        lib.cuCtxPushCurrent_v2.argtypes = [vp]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
        dev, ctx = ctypes.c_int(), vp()
        for what, r in (
            ("cuInit", lib.cuInit(0)),
            ("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), 0)),
            ("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value)),
            ("cuCtxPushCurrent_v2", lib.cuCtxPushCurrent_v2(ctx)),
        ):
            if r:
                raise RuntimeError(f"{what} failed on the double {path}: CUresult {r}")
        self.lib, self.path, self.describe = lib, path, f"{path} (CUDA driver test double)"

    # CUresult and cudaError share the numbers these calls answer (0, 1, 2, 712, 713, 801).
    def register(self, ptr: int, nbytes: int, flags: int) -> int:
        return self.lib.cuMemHostRegister_v2(ptr, nbytes, flags)

    def unregister(self, ptr: int) -> int:
        return self.lib.cuMemHostUnregister(ptr)

    def host_flags(self, ptr: int) -> tuple[int, int]:
        flags = ctypes.c_uint()
        return self.lib.cuMemHostGetFlags(ctypes.byref(flags), ptr), flags.value

    def memory_type(self, ptr: int) -> tuple[int, int, int]:
        if self.host_flags(ptr)[0]:
            return 0, 0, 0  # what the runtime says of unregistered host memory
        dev = ctypes.c_ulonglong()
        self.lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dev), ptr, 0)
        return 0, MEMORY_TYPE_HOST, dev.value

    def is_pinned(self, t: Any) -> bool:
        # What torch's CUDA hooks compute (cudaPointerGetAttributes type Host), asked of the double.
        return self.memory_type(t.data_ptr())[1] == MEMORY_TYPE_HOST

    def seconds(self, fn: Callable[[], None]) -> float:
        """Wall time of fn (CPU copies in a dry run)."""
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
