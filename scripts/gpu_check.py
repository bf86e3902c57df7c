#!/usr/bin/env python3
"""GPU verification of hostreg's ``cuda`` backend on a machine with an NVIDIA GPU.

Normally run by ``scripts/gpu_check.sh``, which builds hostreg with CMake, points
``PYTHONPATH`` at the freshly assembled package and sets ``HOSTREG_BACKEND=cuda``. Each step
adds rows to one plain-text table, printed last; the exit status is 0 only when every row is
PASS (or INFO: a measurement without a target).

  1  build (reported by gpu_check.sh) and ``import hostreg, hostreg.torch`` without ``rich``
  2  differential conformance: the same bad-input sequence sent to the real CUDA runtime
     (libcudart ``cudaHostRegister``/``cudaHostUnregister``, through ctypes) and to hostreg's
     cuda backend, each on its own buffers; every code must be equal
  3  memory hostreg registers is registered for the CUDA runtime (``cudaPointerGetAttributes``,
     ``cudaHostGetFlags``) and for torch (``is_pinned``), and no longer after unregistering
  4  the scenario that fails without CUDA: ``torch.cuda.cudart`` returning ``None`` (as under
     Ascend's ``transfer_to_npu``) with ``hostreg.torch.install()``: PyTorch's
     ``_create_cpu_state_dict``/``_copy_state_dict`` from CUDA tensors; hostreg's own staging;
     ``hostreg.torch.Stager``, sync and async (side stream)
  5  device-to-host bandwidth into pageable, ``pin_memory``, hostreg-staged and mlock-only
     memory (CUDA events, warm-up, median of >= 5), and time to stage a GPT-2-XL state dict

``--dry-run`` needs no GPU and exercises the CPU-side logic of every step. What it replaces
(docs/gpu-check.md has the same list):
  - libcuda: the CUDA driver TEST DOUBLE (tests/doubles/cuda_driver_double.cpp; path in
    HOSTREG_CUDA_LIBRARY) is what hostreg's cuda backend loads;
  - the runtime side of step 2: the expected-code table written next to each call below
    (hostreg's documented semantics; None where the driver decides);
  - the runtime queries of steps 3-4 (pointer type, flags, ``is_pinned``): the double's own
    ``cuMemHostGetFlags``/``cuMemHostGetDevicePointer_v2`` (the double is the very library
    hostreg dlopened, so it sees hostreg's registrations);
  - CUDA tensors: CPU tensors; ``pin_memory`` memory: pageable memory;
  - timing: a fake timer (runs the copies for real on tiny sizes, reports fixed rates), so the
    PASS/FAIL arithmetic of step 5 is exercised deterministically.

Never imports ``rich``. Python 3.9+.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import glob
import io
import json
import mmap
import os
import resource
import shutil
import site
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[1]
PAGE = mmap.PAGESIZE
MiB = 1 << 20
GiB = 1 << 30

# ---- CUDA facts ---------------------------------------------------------------------------
# cudaHostRegister flags (CUDA runtime API, cuda_runtime_api.h: cudaHostRegisterDefault 0x00,
# cudaHostRegisterPortable 0x01, cudaHostRegisterMapped 0x02, cudaHostRegisterIoMemory 0x04,
# cudaHostRegisterReadOnly 0x08).
DEFAULT, PORTABLE, MAPPED, IO_MEMORY, READ_ONLY = 0x0, 0x1, 0x2, 0x4, 0x8
# cudaError_t numbers (driver_types.h).
SUCCESS, INVALID_VALUE, ALREADY_REGISTERED, NOT_REGISTERED = 0, 1, 712, 713
# enum cudaMemoryType (driver_types.h): Unregistered 0, Host 1, Device 2, Managed 3.
MEMORY_TYPE = {0: "Unregistered", 1: "Host", 2: "Device", 3: "Managed"}
MEMORY_TYPE_HOST = 1

# Targets of the GPU proof.
TARGET_VS_PINNED = 0.95  # hostreg-staged D2H >= 0.95x torch pin_memory
TARGET_VS_PAGEABLE = 3.0  # hostreg-staged D2H >= 3x pageable
TARGET_STAGING = 3.0  # hostreg time-to-stage >= 3x faster than PyTorch's path

# Dry run: the fake timer's rates (GB/s, 1e9 bytes). D2H rates are the published H200
# anchors (DeepSpeed PR #8283, rapidsmpf PR #348: pageable 12, registered 51-55, mlock-only
# 10-17); the staging rates are made up so that the ratio passes. --fake-gbps overrides.
FAKE_GBPS = {"pageable": 12.0, "pin_memory": 51.0, "hostreg": 52.0, "mlock": 15.0, "stage-torch": 0.6, "stage-hostreg": 3.0}


# ---- report -------------------------------------------------------------------------------


@dataclass
class Row:
    id: str
    check: str
    result: str = "FAIL"  # PASS | FAIL | INFO (measured, no target) | SKIP (could not run)
    figure: str = "not reported"


class Report:
    """The rows of the final table, a detailed log file and the machine-readable results."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(log_dir / "check.log", "w", buffering=1)
        self.rows: list[Row] = []
        self.data: dict[str, Any] = {}  # details for results.json

    def log(self, msg: str) -> None:
        self._log.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")

    def say(self, msg: str) -> None:
        print(msg, flush=True)
        self.log(msg)

    def table(self) -> str:
        head = Row("step", "check", "result", "key figure")
        rows = [head, *self.rows]
        w_id = max(len(r.id) for r in rows)
        w_check = max(len(r.check) for r in rows)
        w_res = max(len(r.result) for r in rows)
        lines = []
        for i, r in enumerate(rows):
            lines.append(f"{r.id:<{w_id}}  {r.check:<{w_check}}  {r.result:<{w_res}}  {r.figure}".rstrip())
            if i == 0:
                lines.append(f"{'-' * w_id}  {'-' * w_check}  {'-' * w_res}  {'-' * 10}")
        bad = [r for r in self.rows if r.result not in ("PASS", "INFO")]
        lines.append("")
        lines.append(f"overall: {'FAIL' if bad else 'PASS'} ({len(self.rows) - len(bad)}/{len(self.rows)} rows PASS or INFO)")
        return "\n".join(lines)

    def ok(self) -> bool:
        return all(r.result in ("PASS", "INFO") for r in self.rows)

    def close(self, table: str) -> None:
        (self.log_dir / "table.txt").write_text(table + "\n")
        results = {"ok": self.ok(), "rows": [asdict(r) for r in self.rows], "details": self.data}
        (self.log_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
        self._log.close()


# ---- memory and libc ------------------------------------------------------------------------

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
for _fn in (libc.munmap, libc.mlock, libc.munlock):
    _fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MAP_FAILED = ctypes.c_void_p(-1).value
PROT_NONE = 0  # <sys/mman.h>; Python's mmap module has no name for it


class Mappings:
    """Anonymous private mappings made for one side of the differential test; unmap_all()
    after every registration on them is undone (never unmap registered memory)."""

    def __init__(self) -> None:
        self.live: list[tuple[int, int]] = []

    def _map(self, nbytes: int, prot: int) -> int:
        addr = libc.mmap(None, nbytes, prot, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr in (None, MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap({nbytes}) failed")
        return addr

    def rw(self, nbytes: int) -> int:
        """Readable, writable, every page written (so present)."""
        addr = self._map(nbytes, mmap.PROT_READ | mmap.PROT_WRITE)
        ctypes.memset(addr, 0x5A, nbytes)
        self.live.append((addr, nbytes))
        return addr

    def read_only(self, nbytes: int) -> int:
        """Written once, then mprotect(PROT_READ)."""
        addr = self.rw(nbytes)
        if libc.mprotect(addr, nbytes, mmap.PROT_READ) != 0:
            raise OSError(ctypes.get_errno(), "mprotect(PROT_READ) failed")
        return addr

    def prot_none(self, nbytes: int) -> int:
        """Reserved address space with no access (a guard region)."""
        addr = self._map(nbytes, PROT_NONE)
        self.live.append((addr, nbytes))
        return addr

    def unmapped(self, nbytes: int) -> int:
        """An address range that was mapped and is not any more."""
        addr = self._map(nbytes, mmap.PROT_READ | mmap.PROT_WRITE)
        libc.munmap(addr, nbytes)
        return addr

    def tail_unmapped(self, nbytes: int, hole: int) -> int:
        """nbytes mapped, whose last `hole` bytes are then unmapped."""
        addr = self.rw(nbytes)
        libc.munmap(addr + nbytes - hole, hole)
        self.live[-1] = (addr, nbytes - hole)
        return addr

    def unmap_all(self) -> None:
        for addr, nbytes in self.live:
            libc.munmap(addr, nbytes)
        self.live.clear()


def raise_memlock_limit() -> None:
    """Soft RLIMIT_MEMLOCK and RLIMIT_NOFILE up to their hard limits (mlock-only buffers;
    PyTorch's shared path keeps one descriptor per tensor)."""
    for res in (resource.RLIMIT_MEMLOCK, resource.RLIMIT_NOFILE):
        soft, hard = resource.getrlimit(res)
        if soft != hard:
            try:
                resource.setrlimit(res, (hard, hard))
            except (ValueError, OSError):
                pass


def shm_free() -> int:
    return shutil.disk_usage(os.environ.get("HOSTREG_SHM_DIR", "/dev/shm")).free


# ---- the CUDA runtime (real) and its dry-run stand-in ---------------------------------------


class PointerAttributes(ctypes.Structure):
    # struct cudaPointerAttributes (cuda_runtime_api docs): CUDA 12 has type, device,
    # devicePointer, hostPointer; CUDA 13 adds a union (localityDomainOrdinal) and
    # long reserved[7]. Padded generously so either layout fits.
    _fields_ = [
        ("type", ctypes.c_int),
        ("device", ctypes.c_int),
        ("devicePointer", ctypes.c_void_p),
        ("hostPointer", ctypes.c_void_p),
        ("_pad", ctypes.c_long * 16),
    ]


def cudart_candidates(torch: Any) -> list[str]:
    """Where libcudart may be, best first: the one torch already loaded (/proc/self/maps),
    torch's lib dir, the nvidia wheels in site-packages (nvidia/cuda_runtime/lib for CUDA 12,
    nvidia/cu13/lib for CUDA 13), then the loader's names."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                if "libcudart.so" in os.path.basename(path):
                    found.append(path)
    except OSError:
        pass
    found += sorted(glob.glob(str(Path(torch.__file__).parent / "lib" / "libcudart*.so*")))
    roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
    for root in dict.fromkeys(r for r in roots if r):
        for pattern in ("nvidia/cuda_runtime/lib/libcudart.so*", "nvidia/cu13/lib/libcudart.so*", "nvidia/*/lib/libcudart.so*"):
            found += sorted(glob.glob(os.path.join(root, pattern)))
    major = (getattr(torch.version, "cuda", None) or "").split(".")[0]
    names = [f"libcudart.so.{major}"] if major else []
    found += [*names, "libcudart.so.13", "libcudart.so.12", "libcudart.so"]
    return list(dict.fromkeys(found))


class CudaRuntime:
    """The real CUDA runtime (libcudart), called through ctypes."""

    kind = "libcudart"

    def __init__(self, torch: Any) -> None:
        torch.cuda.init()
        errors = []
        for cand in cudart_candidates(torch):
            try:
                lib = ctypes.CDLL(cand)
                lib.cudaHostRegister  # noqa: B018 (a runtime, not some other file)
            except (OSError, AttributeError) as e:
                errors.append(f"{cand}: {e}")
                continue
            self.path = cand
            break
        else:
            raise RuntimeError("no CUDA runtime (libcudart) found: " + "; ".join(errors[-4:]))
        vp, u, sz = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
        for name, args in {
            "cudaSetDevice": [ctypes.c_int],
            "cudaFree": [vp],
            "cudaGetLastError": [],
            "cudaHostRegister": [vp, sz, u],
            "cudaHostUnregister": [vp],
            "cudaHostGetFlags": [ctypes.POINTER(u), vp],
            "cudaHostGetDevicePointer": [ctypes.POINTER(vp), vp, u],
            "cudaPointerGetAttributes": [ctypes.POINTER(PointerAttributes), vp],
            "cudaRuntimeGetVersion": [ctypes.POINTER(ctypes.c_int)],
            "cudaDriverGetVersion": [ctypes.POINTER(ctypes.c_int)],
        }.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        lib.cudaGetErrorName.argtypes, lib.cudaGetErrorName.restype = [ctypes.c_int], ctypes.c_char_p
        self.lib = lib
        # cudaHostRegister needs an initialised runtime and a current context: select device 0
        # and force its primary context into existence with the classic cudaFree(0).
        for what, r in (("cudaSetDevice(0)", lib.cudaSetDevice(0)), ("cudaFree(0)", lib.cudaFree(None))):
            if r != 0:
                raise RuntimeError(f"{what} failed: {self.name(r)}")
        rt, drv = ctypes.c_int(), ctypes.c_int()
        lib.cudaRuntimeGetVersion(ctypes.byref(rt))
        lib.cudaDriverGetVersion(ctypes.byref(drv))
        self.describe = f"{self.path} (runtime {rt.value // 1000}.{rt.value % 1000 // 10}, driver {drv.value // 1000}.{drv.value % 1000 // 10})"

    def _done(self, r: int) -> int:
        # A failed call also sets the runtime's last error, which torch's later kernel-launch
        # checks (cudaGetLastError) would report as theirs: clear it.
        if r != 0:
            self.lib.cudaGetLastError()
        return r

    def name(self, code: int) -> str:
        n = self.lib.cudaGetErrorName(code)
        return f"{n.decode() if n else '?'} ({code})"

    def register(self, ptr: int, nbytes: int, flags: int) -> int:
        return self._done(self.lib.cudaHostRegister(ptr, nbytes, flags))

    def unregister(self, ptr: int) -> int:
        return self._done(self.lib.cudaHostUnregister(ptr))

    def memory_type(self, ptr: int) -> tuple[int, int, int]:
        """(code, cudaMemoryType, device pointer) of cudaPointerGetAttributes."""
        a = PointerAttributes()
        r = self._done(self.lib.cudaPointerGetAttributes(ctypes.byref(a), ptr))
        return (r, a.type, a.devicePointer or 0) if r == 0 else (r, 0, 0)

    def host_flags(self, ptr: int) -> tuple[int, int]:
        flags = ctypes.c_uint()
        return self._done(self.lib.cudaHostGetFlags(ctypes.byref(flags), ptr)), flags.value

    def is_pinned(self, t: Any) -> bool:
        return bool(t.is_pinned())


class DoubleDriver:
    """Dry run: the CUDA driver test double, asked directly. It is the same file hostreg's
    cuda backend dlopened (HOSTREG_CUDA_LIBRARY; dlopen returns the one loaded copy), so it
    knows hostreg's registrations. Not NVIDIA's library."""

    kind = "driver test double"

    def __init__(self, path: str) -> None:
        self.path = self.describe = path
        lib = ctypes.CDLL(path)
        vp = ctypes.c_void_p
        lib.cuMemHostGetFlags.argtypes = [ctypes.POINTER(ctypes.c_uint), vp]
        lib.cuMemHostGetDevicePointer_v2.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), vp, ctypes.c_uint]
        lib.cuCtxPushCurrent_v2.argtypes = [vp]
        lib.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
        dev, ctx = ctypes.c_int(), vp()
        # Driver API (cuda.h): cuInit(0), then a current context for memory calls; the CUDA
        # runtime would make device 0's primary context current, and so does this.
        for what, r in (
            ("cuInit", lib.cuInit(0)),
            ("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(dev), 0)),
            ("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev.value)),
            ("cuCtxPushCurrent_v2", lib.cuCtxPushCurrent_v2(ctx)),
        ):
            if r != 0:
                raise RuntimeError(f"{what} failed on the double {path}: CUresult {r}")
        self.lib = lib

    def name(self, code: int) -> str:
        return f"({code})"

    def memory_type(self, ptr: int) -> tuple[int, int, int]:
        code, _ = self.host_flags(ptr)
        if code != 0:
            return 0, 0, 0  # what the runtime says of unregistered host memory
        dev = ctypes.c_ulonglong()
        self.lib.cuMemHostGetDevicePointer_v2(ctypes.byref(dev), ptr, 0)
        return 0, MEMORY_TYPE_HOST, dev.value

    def host_flags(self, ptr: int) -> tuple[int, int]:
        flags = ctypes.c_uint()
        return self.lib.cuMemHostGetFlags(ctypes.byref(flags), ptr), flags.value

    def is_pinned(self, t: Any) -> bool:
        # CPU-only torch has no is_pinned() to ask: what torch's CUDA hooks compute
        # (cudaPointerGetAttributes(...).type == cudaMemoryTypeHost), asked of the double.
        return self.memory_type(t.data_ptr())[1] == MEMORY_TYPE_HOST


# ---- timers --------------------------------------------------------------------------------


class CudaTimer:
    """CUDA events around the copies (device time), wall clock around staging."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch

    def copy_seconds(self, kind: str, nbytes: int, fn: Callable[[], None]) -> float:
        cuda = self.torch.cuda
        cuda.synchronize()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    def wall_seconds(self, kind: str, nbytes: int, fn: Callable[[], None]) -> float:
        self.torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        self.torch.cuda.synchronize()
        return time.perf_counter() - t0


class FakeTimer:
    """Dry run: runs fn for real, reports nbytes at a fixed rate per kind (FAKE_GBPS)."""

    def __init__(self, gbps: dict[str, float]) -> None:
        self.gbps = gbps

    def copy_seconds(self, kind: str, nbytes: int, fn: Callable[[], None]) -> float:
        fn()
        return nbytes / (self.gbps[kind] * 1e9)

    wall_seconds = copy_seconds


# ---- context ---------------------------------------------------------------------------------


class Ctx:
    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args = args
        self.dry = args.dry_run
        self.report = report
        self._runtime: Any = None
        self._timer: Any = None

    @property
    def torch(self) -> Any:
        import torch  # imported at first use: step 1 runs without it

        return torch

    @property
    def device(self) -> Any:
        return self.torch.device("cpu" if self.dry else "cuda")

    @property
    def timer(self) -> Any:
        if self._timer is None:
            self._timer = FakeTimer({**FAKE_GBPS, **self.args.fake_gbps}) if self.dry else CudaTimer(self.torch)
        return self._timer

    @property
    def runtime(self) -> Any:
        """The CUDA runtime (real) or the driver double (dry run); made at first use."""
        if self._runtime is None:
            if self.dry:
                self._runtime = DoubleDriver(os.environ["HOSTREG_CUDA_LIBRARY"])
            else:
                self._runtime = CudaRuntime(self.torch)
            self.report.log(f"runtime: {self._runtime.kind}: {self._runtime.describe}")
        return self._runtime

    def sync(self) -> None:
        if not self.dry:
            self.torch.cuda.synchronize()

    def log(self, msg: str) -> None:
        self.report.log(msg)


def code_name(code: Optional[int]) -> str:
    if code is None:
        return "-"
    import hostreg

    try:
        return f"{hostreg.cudaError(code).name} ({code})"
    except ValueError:
        return str(code)


# ---- step 1: build and imports ----------------------------------------------------------------


def step_build(ctx: Ctx, rows: dict[str, Row]) -> None:
    a = ctx.args
    rows["1a"].result = a.build_status or "INFO"
    rows["1a"].figure = a.build_detail or "not built by gpu_check.sh (hostreg as found on sys.path)"

    # `rich` is imported by hostreg's CLI only; the library must import without it.
    code = (
        "import sys; sys.modules['rich'] = None  # any `import rich` now raises ImportError\n"
        "import hostreg, hostreg.torch, hostreg.models\n"
        "print(hostreg.__file__); print(hostreg._hostreg.__file__); print(hostreg.backend())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=os.environ)
    ctx.log(f"import check rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        rows["1b"].figure = f"import failed without rich: {last}"
        return
    init, ext, backend = r.stdout.splitlines()[:3]
    problems = []
    if a.expect_package and Path(init).resolve().parent != Path(a.expect_package).resolve():
        problems.append(f"imported {init}, not the build in {a.expect_package}")
    if backend != "cuda":
        problems.append(f"backend is {backend!r}, not 'cuda'")
    have_rich = subprocess.run([sys.executable, "-c", "import rich"], capture_output=True).returncode == 0
    rows["1b"].result = "FAIL" if problems else "PASS"
    rows["1b"].figure = "; ".join(problems) or f"ok from {Path(ext).parent} (backend cuda; rich {'installed' if have_rich else 'absent'})"


# ---- step 2: differential conformance --------------------------------------------------------


class Side:
    """One side of the differential test: records every call's code by (case, label)."""

    def __init__(self, name: str, register: Callable[[int, int, int], int], unregister: Callable[[int], int]) -> None:
        self.name = name
        self._register, self._unregister = register, unregister
        self.codes: dict[tuple[str, str], int] = {}
        self.expected: dict[tuple[str, str], Optional[int]] = {}
        self.live: set[int] = set()
        self.case = ""
        self.mem = Mappings()

    def reg(self, label: str, ptr: int, nbytes: int, flags: int, expect: Optional[int]) -> int:
        code = int(self._register(ptr, nbytes, flags))
        self.codes[(self.case, label)] = code
        self.expected[(self.case, label)] = expect
        if code == 0:
            self.live.add(ptr)
        return code

    def unreg(self, label: str, ptr: int, expect: Optional[int]) -> None:
        code = int(self._unregister(ptr))
        self.codes[(self.case, label)] = code
        self.expected[(self.case, label)] = expect
        if code == 0:
            self.live.discard(ptr)

    def end_case(self) -> list[int]:
        """Undo what the case left registered (not recorded), then unmap its memory."""
        leftovers = sorted(self.live)
        for ptr in leftovers:
            self._unregister(ptr)
        self.live.clear()
        self.mem.unmap_all()
        return leftovers


# The bad-input matrix. Each case runs once per side on that side's own fresh memory.
# `expect` is hostreg's documented answer (README "Semantics"; CUDA's codes): it is the
# reference of the dry run. None: the driver decides (flags it may refuse on ordinary RAM,
# memory it cannot pin); only the real runtime can say, and hostreg must say the same.
N = 4 * PAGE


def _case_null(s: Side) -> None:
    s.reg("register NULL", 0, N, DEFAULT, expect=INVALID_VALUE)


def _case_zero(s: Side) -> None:
    s.reg("register 0 bytes", s.mem.rw(N), 0, DEFAULT, expect=INVALID_VALUE)


def _case_wrap(s: Side) -> None:
    b = s.mem.rw(N)
    s.reg("register past 2**64", b, (1 << 64) - b + PAGE, DEFAULT, expect=INVALID_VALUE)


def _case_flag(flags: int, expect: Optional[int]) -> Callable[[Side], None]:
    def case(s: Side) -> None:
        b = s.mem.rw(N)
        if s.reg(f"register flags {flags:#x}", b, N, flags, expect=expect) == 0:
            s.unreg("unregister", b, expect=SUCCESS)

    return case


def _case_unaligned(s: Side) -> None:
    b = s.mem.rw(N) + 100
    s.reg("register unaligned ptr+100, 1000 bytes", b, 1000, DEFAULT, expect=SUCCESS)
    s.unreg("unregister", b, expect=SUCCESS)


def _case_double(s: Side) -> None:
    b = s.mem.rw(N)
    s.reg("register", b, N, DEFAULT, expect=SUCCESS)
    s.reg("register again", b, N, DEFAULT, expect=ALREADY_REGISTERED)
    s.unreg("unregister", b, expect=SUCCESS)


def _case_overlap(label: str, offset: int, nbytes: int) -> Callable[[Side], None]:
    """[b+P, b+3P) registered, then [b+offset, b+offset+nbytes)."""

    def case(s: Side) -> None:
        b = s.mem.rw(N)
        s.reg("register [P, 3P)", b + PAGE, 2 * PAGE, DEFAULT, expect=SUCCESS)
        if s.reg(f"register {label}", b + offset, nbytes, DEFAULT, expect=ALREADY_REGISTERED) == 0:
            s.unreg("unregister second", b + offset, expect=SUCCESS)
        s.unreg("unregister [P, 3P)", b + PAGE, expect=SUCCESS)

    return case


def _case_adjacent_shared_page(s: Side) -> None:
    # Byte-disjoint ranges sharing one page: hostreg says no byte overlaps (0).
    b = s.mem.rw(N)
    s.reg("register [0, P+100)", b, PAGE + 100, DEFAULT, expect=SUCCESS)
    if s.reg("register [P+100, 2P)", b + PAGE + 100, PAGE - 100, DEFAULT, expect=SUCCESS) == 0:
        s.unreg("unregister second", b + PAGE + 100, expect=SUCCESS)
    s.unreg("unregister first", b, expect=SUCCESS)


def _case_unreg_interior(s: Side) -> None:
    b = s.mem.rw(N)
    s.reg("register", b, N, DEFAULT, expect=SUCCESS)
    s.unreg("unregister base+P", b + PAGE, expect=NOT_REGISTERED)
    s.unreg("unregister base+8", b + 8, expect=NOT_REGISTERED)
    s.unreg("unregister base", b, expect=SUCCESS)


def _case_unreg_unknown(s: Side) -> None:
    s.unreg("unregister never-registered", s.mem.rw(N), expect=NOT_REGISTERED)


def _case_unreg_twice(s: Side) -> None:
    b = s.mem.rw(N)
    s.reg("register", b, N, DEFAULT, expect=SUCCESS)
    s.unreg("unregister", b, expect=SUCCESS)
    s.unreg("unregister again", b, expect=NOT_REGISTERED)


def _case_unreg_null(s: Side) -> None:
    s.unreg("unregister NULL", 0, expect=NOT_REGISTERED)


def _case_unmapped(s: Side) -> None:
    s.reg("register unmapped", s.mem.unmapped(N), N, DEFAULT, expect=INVALID_VALUE)


def _case_tail_unmapped(s: Side) -> None:
    s.reg("register 4 pages, last 2 unmapped", s.mem.tail_unmapped(N, 2 * PAGE), N, DEFAULT, expect=INVALID_VALUE)


def _case_prot(kind: str, flags: int) -> Callable[[Side], None]:
    def case(s: Side) -> None:
        b = s.mem.prot_none(N) if kind == "none" else s.mem.read_only(N)
        if s.reg(f"register flags {flags:#x}", b, N, flags, expect=None) == 0:
            s.unreg("unregister", b, expect=SUCCESS)

    return case


CASES: list[tuple[str, Callable[[Side], None]]] = [
    ("NULL pointer", _case_null),
    ("0 bytes", _case_zero),
    ("wrap-around", _case_wrap),
    ("unknown flag 0x10", _case_flag(0x10, INVALID_VALUE)),
    ("unknown flag 0x80000000", _case_flag(0x80000000, INVALID_VALUE)),
    ("flag Portable 0x1", _case_flag(PORTABLE, SUCCESS)),
    ("flag Mapped 0x2", _case_flag(MAPPED, SUCCESS)),
    ("flag IoMemory 0x4 on RAM", _case_flag(IO_MEMORY, None)),  # the driver decides
    ("flag ReadOnly 0x8 on RW memory", _case_flag(READ_ONLY, None)),  # device attribute 113
    ("unaligned pointer", _case_unaligned),
    ("double register", _case_double),
    ("partial overlap left", _case_overlap("[0, 2P)", 0, 2 * PAGE)),
    ("partial overlap right", _case_overlap("[2P, 4P)", 2 * PAGE, 2 * PAGE)),
    ("nested", _case_overlap("[P+64, P+192)", PAGE + 64, 128)),
    ("nested, same base", _case_overlap("[P, 2P)", PAGE, PAGE)),
    ("enclosing", _case_overlap("[0, 4P)", 0, 4 * PAGE)),
    ("adjacent, sharing a page", _case_adjacent_shared_page),
    ("unregister interior pointer", _case_unreg_interior),
    ("unregister unknown pointer", _case_unreg_unknown),
    ("unregister twice", _case_unreg_twice),
    ("unregister NULL", _case_unreg_null),
    ("unmapped memory", _case_unmapped),
    ("partly unmapped memory", _case_tail_unmapped),
    ("PROT_NONE memory", _case_prot("none", DEFAULT)),
    ("read-only memory, Default", _case_prot("read", DEFAULT)),
    ("read-only memory, ReadOnly", _case_prot("read", READ_ONLY)),
]


def run_cases(sides: list[Side]) -> list[tuple[str, str, str]]:
    """Every case of CASES on every side (each on its own memory), case by case. Returns what
    the cases left registered (side, case, address): undone, and a failure."""
    leftovers = []
    for case, fn in CASES:
        for side in sides:
            side.case = case
            fn(side)
            leftovers += [(side.name, case, hex(p)) for p in side.end_case()]
    return leftovers


@dataclass
class Comparison:
    lines: list[str] = field(default_factory=list)  # every call; "!= " marks a difference
    diffs: list[str] = field(default_factory=list)
    checked: int = 0
    undecided: int = 0  # dry run: calls whose code the driver decides (no expectation)


def compare(reference: dict, ref_name: str, codes: dict, none_is_undecided: bool) -> Comparison:
    """Codes of the reference (the runtime, or the expected table) against hostreg's, by
    (case, call). A call only one side made is a difference."""
    c = Comparison()
    for key in dict.fromkeys([*reference, *codes]):
        a, b = reference.get(key), codes.get(key)
        if none_is_undecided and a is None and key in reference:
            c.undecided += 1
            same = True
        else:
            c.checked += 1
            same = a == b
        line = f"{key[0]:<32} {key[1]:<40} {ref_name}={code_name(a):<42} hostreg={code_name(b)}"
        c.lines.append(("   " if same else "!= ") + line)
        if not same:
            c.diffs.append(line)
    return c


def step_conformance(ctx: Ctx, rows: dict[str, Row]) -> None:
    import hostreg

    hr = Side("hostreg", hostreg.host_register, hostreg.host_unregister)
    rt: Optional[Side] = None
    if not ctx.dry:
        runtime = ctx.runtime
        rt = Side("runtime", runtime.register, runtime.unregister)
    if hostreg.backend() != "cuda":
        raise RuntimeError(f"hostreg's backend is {hostreg.backend()!r}, not cuda: {hostreg.last_error().message}")
    regs0 = hostreg.stats().registrations
    leftovers = run_cases([rt, hr] if rt else [hr])

    if rt:
        reference, ref_name = rt.codes, "runtime"
    else:  # dry run: the expected-code table written into CASES
        reference, ref_name = hr.expected, "expected"
    c = compare(reference, ref_name, hr.codes, none_is_undecided=rt is None)
    ctx.log("differential conformance (!= marks a difference):\n" + "\n".join(c.lines))
    ctx.report.data["conformance"] = [
        {"case": k[0], "call": k[1], ref_name: reference.get(k), "hostreg": hr.codes.get(k), "expected": hr.expected.get(k)}
        for k in dict.fromkeys([*reference, *hr.codes])
    ]
    for d in c.diffs:
        ctx.report.say(f"  DIFF {d}")
    problems = []
    if leftovers:
        problems.append(f"cases left {len(leftovers)} registrations (undone)")
        ctx.log(f"leftovers: {leftovers}")
    if hostreg.stats().registrations != regs0:
        problems.append(f"hostreg holds {hostreg.stats().registrations - regs0} registrations afterwards")
    r = rows["2"]
    r.result = "FAIL" if c.diffs or problems else "PASS"
    what = f"{c.checked - len(c.diffs)}/{c.checked} codes equal"
    if rt:
        what += f" ({Path(ctx.runtime.path).name})"
    else:
        what += f" to the expected table ({c.undecided} driver-decided calls not checked: dry run)"
    r.figure = "; ".join([what, *problems])


# ---- step 3: real registration -----------------------------------------------------------------


def step_registration(ctx: Ctx, rows: dict[str, Row]) -> None:
    import hostreg
    from hostreg._staging import stage_layout

    torch, rt = ctx.torch, ctx.runtime
    n = 8 * MiB
    mem = Mappings()
    base = mem.rw(n + PAGE)
    ptr = base + 100  # need not be page-aligned
    t = torch.frombuffer((ctypes.c_uint8 * n).from_address(ptr), dtype=torch.uint8)
    facts: dict[str, Any] = {}
    problems: list[str] = []

    def expect(cond: bool, what: str) -> None:
        if not cond:
            problems.append(what)

    try:
        facts["before"] = (rt.memory_type(ptr), rt.is_pinned(t))
        expect(facts["before"][0][1] != MEMORY_TYPE_HOST and not facts["before"][1], "registered before register")
        code = hostreg.host_register(ptr, n, PORTABLE)
        expect(code == 0, f"host_register: {code}")
        reg = hostreg.registration(ptr)
        mt = rt.memory_type(ptr)
        flags = rt.host_flags(ptr)
        pinned = rt.is_pinned(t)
        facts["registered"] = {"memory_type": mt, "host_flags": flags, "is_pinned": pinned, "hostreg": reg}
        expect(mt[0] == 0 and mt[1] == MEMORY_TYPE_HOST, f"runtime memory type {mt} (want {MEMORY_TYPE_HOST} Host)")
        expect(flags[0] == 0, f"cudaHostGetFlags: {rt.name(flags[0])}")
        expect(pinned, "is_pinned() False while registered")
        expect(reg is not None and reg.backend == "cuda", f"hostreg.registration: {reg}")
        if reg is not None and mt[2]:
            expect(reg.device_ptr == mt[2], f"device pointer: hostreg {reg.device_ptr:#x}, runtime {mt[2]:#x}")
        # The copy engine writes into it: a device-to-host copy lands byte for byte.
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=ctx.device)
        t.copy_(src, non_blocking=True)
        ctx.sync()
        expect(torch.equal(t, src.cpu()), "D2H copy into the registered memory differs")
        code = hostreg.host_unregister(ptr)
        expect(code == 0, f"host_unregister: {code}")
        mt_after, pinned_after = rt.memory_type(ptr), rt.is_pinned(t)
        facts["unregistered"] = {"memory_type": mt_after, "is_pinned": pinned_after, "host_flags": rt.host_flags(ptr)}
        expect(mt_after[1] != MEMORY_TYPE_HOST and not pinned_after, f"still registered after unregister: {mt_after}, is_pinned {pinned_after}")
    finally:
        if hostreg.registration(ptr) is not None:  # a check above failed half-way
            hostreg.host_unregister(ptr)
        del t
        mem.unmap_all()

    # A tensor of hostreg.torch's staging arena: pinned, and not once the arena is closed.
    staged = stage_layout({"w": torch.empty(MiB // 4), "b": torch.empty(3)})
    w = staged.state_dict["w"]
    in_arena, arena_type = rt.is_pinned(w), rt.memory_type(w.data_ptr())[1]
    staged.arena.close()
    closed = rt.is_pinned(w)
    facts["arena"] = {"is_pinned": in_arena, "memory_type": arena_type, "after close": closed}
    expect(in_arena and arena_type == MEMORY_TYPE_HOST and not closed, f"staging arena: is_pinned {in_arena} -> {closed} after close")
    del staged, w
    gc.collect()
    ctx.log(f"registration facts: {facts}")
    ctx.report.data["registration"] = facts
    rows["3"].result = "FAIL" if problems else "PASS"
    rows["3"].figure = "; ".join(problems) or (
        f"type {MEMORY_TYPE_HOST} (Host), cudaHostGetFlags ok, is_pinned True -> False after unregister; arena too"
    )


# ---- step 4: the failing scenario, hostreg staging, Stager ------------------------------------------


def scenario_state_dict(ctx: Ctx) -> dict:
    """docs/pytorch.md's scenario, tensors on the device, plus one
    larger tensor."""
    torch, dev = ctx.torch, ctx.device
    saved = io.BytesIO()
    torch.save(torch.arange(4.0), saved)
    saved.seek(0)
    return {
        "weight": torch.arange(10, dtype=torch.float32, device=dev),
        "bias": torch.ones(10, device=dev),
        "buffer": saved,
        "raw": saved.getvalue(),
        "step": torch.tensor(7.0, device=dev),
        "lr": 1.5,
        "nested": {"list": [1, "two", torch.full((3,), 3.0, device=dev)]},
        "big": torch.randn(1 << 20, device=dev),
    }


def tensors_of(sd: Any) -> list[Any]:
    from hostreg._tree import flatten

    return flatten(sd)[0]


def values_equal(ctx: Ctx, src: dict, dst: dict) -> list[str]:
    torch = ctx.torch
    bad = []
    for s, d in zip(tensors_of(src), tensors_of(dst)):
        if not torch.equal(s.cpu(), d):
            bad.append(f"tensor {tuple(s.shape)} differs")
    if (dst["lr"], dst["raw"], dst["nested"]["list"][:2]) != (1.5, src["raw"], [1, "two"]):
        bad.append("non-tensor values differ")
    if dst["buffer"].getvalue() != src["raw"]:
        bad.append("BytesIO differs")
    return bad


def step_scenario(ctx: Ctx, rows: dict[str, Row]) -> None:
    import hostreg
    import hostreg.torch as ht
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    torch, rt = ctx.torch, ctx.runtime
    sd = scenario_state_dict(ctx)
    regs0 = hostreg.stats().registrations
    if regs0:
        ctx.log(f"step 4 starts with {regs0} live registrations: {hostreg.registrations()}")

    # 4a: torch.cuda.cudart() returns None (what Ascend's transfer_to_npu causes).
    problems: list[str] = []
    was_installed = ht.is_installed()  # e.g. HOSTREG_AUTO_INSTALL=1: start from torch's own
    ht.uninstall()
    original = torch.cuda.cudart
    torch.cuda.cudart = lambda: None
    try:
        ht.install()
        problems += [] if torch.cuda.cudart() is hostreg.cudart() else ["install() did not route cudart() to hostreg"]
        cpu = _create_cpu_state_dict(sd, share_memory=True, pin_memory=True)
        _copy_state_dict(sd, cpu)
        ctx.sync()
        problems += values_equal(ctx, sd, cpu)
        ts = [t for t in tensors_of(cpu) if t.dim() > 0]  # PyTorch leaves 0-d tensors unpinned
        ptrs = [t.data_ptr() for t in ts]
        pinned = [rt.is_pinned(t) for t in ts]
        shared = [t.is_shared() for t in ts]
        live = hostreg.stats().registrations - regs0
        problems += [] if all(pinned) else [f"is_pinned {pinned}"]
        problems += [] if all(shared) else [f"is_shared {shared}"]
        problems += [] if live == len(ts) else [f"{live} hostreg registrations for {len(ts)} tensors"]
        del cpu, ts
        gc.collect()  # PyTorch's finalizers unregister through the drop-in
        after = hostreg.stats().registrations
        still = [hex(p) for p in ptrs if rt.memory_type(p)[1] == MEMORY_TYPE_HOST]
        problems += [] if after == regs0 else [f"{after - regs0} registrations left after del + gc"]
        problems += [] if not still else [f"runtime still reports {still} as host memory"]
        rows["4a"].figure = f"{len(ptrs)} tensors pinned+shared, values equal, registrations {live} -> {after - regs0} after gc"
    finally:
        gc.collect()
        ht.uninstall()
        torch.cuda.cudart = original
        if was_installed:
            ht.install()
    if problems:
        rows["4a"].figure = "; ".join(problems)
    rows["4a"].result = "FAIL" if problems else "PASS"

    # 4b: hostreg's own staging: one arena, one registration.
    problems = []
    staged = ht.create_cpu_state_dict(sd)
    ht.copy_state_dict(sd, staged)
    problems += values_equal(ctx, sd, staged)
    ts = tensors_of(staged)
    pinned = [rt.is_pinned(t) for t in ts]
    live = hostreg.stats().registrations - regs0
    arena = ts[0].data_ptr()
    problems += [] if all(pinned) else [f"is_pinned {pinned}"]
    problems += [] if live == 1 else [f"{live} registrations (want 1 arena)"]
    del staged, ts
    gc.collect()
    problems += [] if hostreg.stats().registrations == regs0 else ["registration left after del + gc"]
    problems += [] if rt.memory_type(arena)[1] != MEMORY_TYPE_HOST else ["runtime still reports the arena as host memory"]
    rows["4b"].result = "FAIL" if problems else "PASS"
    rows["4b"].figure = "; ".join(problems) or f"{len(pinned)} tensors in 1 registration, pinned, values equal, 0 left after gc"

    # 4c: Stager, twice; the second save reuses the first save's arena.
    problems = []
    stager = ht.Stager()
    try:
        out = stager.stage(sd)
        problems += values_equal(ctx, sd, out)
        problems += [] if all(rt.is_pinned(t) for t in tensors_of(out)) else ["first stage not pinned"]
        del out
        with torch.no_grad():
            for t in tensors_of(sd):
                t.add_(1)
        out = stager.stage(sd)
        problems += [f"second stage: {p}" for p in values_equal(ctx, sd, out)]
        problems += [] if all(rt.is_pinned(t) for t in tensors_of(out)) else ["second stage not pinned"]
        problems += [] if stager.arenas_created == 1 else [f"{stager.arenas_created} arenas for 2 saves (want 1)"]
        del out
    finally:
        stager.close()
        gc.collect()
    problems += [] if hostreg.stats().registrations == regs0 else ["registrations left after close"]
    rows["4c"].result = "FAIL" if problems else "PASS"
    rows["4c"].figure = "; ".join(problems) or "staged twice into 1 arena, pinned, values right, 0 left after close"

    # 4d: Stager(async_staging=True): stage() returns a Future at once; the copies run on the
    # stager's own stream, after the work queued on the caller's stream before stage().
    problems = []
    stager = ht.Stager(async_staging=True)
    try:
        side = stager._stream
        if not ctx.dry:
            current = torch.cuda.current_stream()
            problems += [] if side is not None and side.stream_id != current.stream_id else ["no side stream of its own"]
        with torch.no_grad():
            for t in tensors_of(sd):
                t.mul_(3)  # queued on the caller's stream just before stage(): must be in the copy
        fut = stager.stage(sd)
        out = fut.result(timeout=120)
        ctx.sync()
        problems += [f"async stage: {p}" for p in values_equal(ctx, sd, out)]  # the values after mul_
        problems += [] if all(rt.is_pinned(t) for t in tensors_of(out)) else ["async stage not pinned"]
        del out, fut
    finally:
        stager.close()
        gc.collect()
    problems += [] if hostreg.stats().registrations == regs0 else ["registrations left after close"]
    rows["4d"].result = "FAIL" if problems else "PASS"
    rows["4d"].figure = "; ".join(problems) or (
        "Future; copies on a side stream after the caller's queued work; values right, pinned"
        if not ctx.dry else "Future; values right, pinned (dry run: no stream)"
    )


# ---- step 5: bandwidth and time to stage -------------------------------------------------------


def model_state_dict(ctx: Ctx, name: str) -> dict:
    """GPT-2-shaped state dict made on the device (meta + to_empty: no slow CPU init)."""
    from hostreg.models import GPT, MODELS

    torch = ctx.torch
    with torch.device("meta"):
        model = GPT(MODELS[name])
    model = model.to_empty(device=ctx.device)
    gen = torch.Generator(device=ctx.device).manual_seed(0)
    with torch.no_grad():
        for t in model.state_dict().values():
            t.uniform_(-1, 1, generator=gen)
    return dict(model.state_dict())


def copy_all(srcs: list, dsts: list) -> Callable[[], None]:
    def run() -> None:
        for s, d in zip(srcs, dsts):
            d.copy_(s, non_blocking=True)

    return run


def bandwidth(ctx: Ctx, kind: str, srcs: list, dsts: list) -> float:
    """Median GB/s (1e9 bytes/s) of copying srcs (device) into dsts (host)."""
    nbytes = sum(s.nbytes for s in srcs)
    run = copy_all(srcs, dsts)
    for _ in range(ctx.args.warmup):
        run()
        ctx.sync()
    times = [ctx.timer.copy_seconds(kind, nbytes, run) for _ in range(ctx.args.repeats)]
    gbps = nbytes / statistics.median(times) / 1e9
    ctx.log(f"D2H {kind}: {nbytes:,} bytes, {len(srcs)} tensors, times {[round(t * 1e3, 3) for t in times]} ms -> {gbps:.2f} GB/s")
    return gbps


def aligned_views(ctx: Ctx, buf: Any, srcs: list) -> list:
    """Views of one uint8 buffer shaped like srcs, each at a 256-byte aligned offset."""
    out, off = [], 0
    for s in srcs:
        off = -(-off // 256) * 256
        out.append(buf[off : off + s.nbytes].view(s.dtype).view(s.shape))
        off += s.nbytes
    return out


def aligned_total(srcs: list) -> int:
    off = 0
    for s in srcs:
        off = -(-off // 256) * 256 + s.nbytes
    return off


def measure_kinds(ctx: Ctx, label: str, sd: dict) -> dict[str, Any]:
    """D2H GB/s of sd's tensors into each kind of host memory, one kind at a time."""
    import hostreg.torch as ht

    torch = ctx.torch
    srcs = list(sd.values())
    total = aligned_total(srcs)
    out: dict[str, Any] = {}

    # (a) pageable: plain torch.empty.
    dsts = [torch.empty(s.shape, dtype=s.dtype) for s in srcs]
    out["pageable"] = bandwidth(ctx, "pageable", srcs, dsts)
    del dsts

    # (b) torch's pinned memory (CachingHostAllocator, cudaHostAlloc): what pin_memory() gives.
    if ctx.dry:  # CPU-only torch cannot pin
        dsts = [torch.empty(s.shape, dtype=s.dtype) for s in srcs]
    else:
        dsts = [torch.empty(s.shape, dtype=s.dtype, pin_memory=True) for s in srcs]
    out["pin_memory"] = bandwidth(ctx, "pin_memory", srcs, dsts)
    del dsts
    gc.collect()
    if not ctx.dry and hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()  # give the pinned blocks back before the next kind

    # (c) hostreg-staged: one arena registered by the cuda backend (shared when /dev/shm can
    # hold it, else an unshared arena: registration, not sharing, is what the copy engine sees).
    share = shm_free() > total * 1.05 + 64 * MiB
    staged = ht.create_cpu_state_dict(sd, share_memory=share)
    dsts = [staged[k] for k in sd]
    out["hostreg"] = bandwidth(ctx, "hostreg", srcs, dsts)
    out["hostreg_shared"] = share
    out["hostreg_values_ok"] = all(ctx.torch.equal(d.to(ctx.device), s) for s, d in zip(srcs, dsts))
    out["hostreg_pinned"] = ctx.runtime.is_pinned(dsts[0])
    del staged, dsts
    gc.collect()

    # (d) posix-only locked: pageable memory mlock'ed, not registered with CUDA.
    buf = torch.empty(total, dtype=torch.uint8)
    addr = buf.data_ptr()
    if libc.mlock(addr, total) != 0:
        err = ctypes.get_errno()
        libc.munlock(addr, total)  # mlock may have locked part of it
        out["mlock"] = None
        out["mlock_error"] = f"mlock({total:,}) failed: {os.strerror(err)} (RLIMIT_MEMLOCK {resource.getrlimit(resource.RLIMIT_MEMLOCK)})"
        ctx.log(out["mlock_error"])
    else:
        try:
            out["mlock_cuda_type"] = ctx.runtime.memory_type(addr)[1]  # 0: CUDA knows nothing of it
            out["mlock"] = bandwidth(ctx, "mlock", srcs, aligned_views(ctx, buf, srcs))
        finally:
            libc.munlock(addr, total)
    del buf
    gc.collect()
    out["bytes"] = sum(s.nbytes for s in srcs)
    ctx.log(f"{label}: {out}")
    return out


def ratio_row(row: Row, a: float, b: float, a_name: str, b_name: str, target: float) -> None:
    ratio = a / b
    row.result = "PASS" if ratio >= target else "FAIL"
    row.figure = f"{ratio:.2f}x ({a_name} {a:.1f} vs {b_name} {b:.1f} GB/s), target >= {target:g}x"


def stage_times(ctx: Ctx, sd: dict) -> tuple[float, float, list[str]]:
    """Seconds to a usable staged copy (create + register + first D2H copy) with PyTorch's
    path (_create_cpu_state_dict(share_memory=True, pin_memory=True) + _copy_state_dict) and
    with hostreg's (create_cpu_state_dict + copy_state_dict)."""
    import hostreg
    import hostreg.torch as ht
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    nbytes = sum(t.nbytes for t in sd.values())
    problems: list[str] = []
    holder: dict[str, Any] = {}

    def torch_path() -> None:
        holder["cpu"] = _create_cpu_state_dict(sd, share_memory=True, pin_memory=True)
        _copy_state_dict(sd, holder["cpu"], non_blocking=True)

    def hostreg_path() -> None:
        holder["cpu"] = ht.create_cpu_state_dict(sd)
        ht.copy_state_dict(sd, holder["cpu"])

    secs = {}
    for kind, fn in (("stage-torch", torch_path), ("stage-hostreg", hostreg_path)):
        was_installed = ht.is_installed()
        if ctx.dry:
            ht.install()  # CPU-only torch: PyTorch's path pins through the drop-in
        try:
            secs[kind] = ctx.timer.wall_seconds(kind, nbytes, fn)
            cpu = holder.pop("cpu")
            if not all(ctx.torch.equal(cpu[k].to(ctx.device), v) for k, v in sd.items()):
                problems.append(f"{kind}: values differ")
            if not all(ctx.runtime.is_pinned(t) for t in cpu.values() if t.dim() > 0):
                problems.append(f"{kind}: not pinned")
            del cpu
            gc.collect()
        finally:
            holder.clear()
            gc.collect()
            if ctx.dry and not was_installed:
                ht.uninstall()
        ctx.log(f"{kind}: {secs[kind]:.3f} s for {nbytes:,} bytes; hostreg registrations now {hostreg.stats().registrations}")
    return secs["stage-torch"], secs["stage-hostreg"], problems


def size_text(mib: int) -> str:
    return f"{mib / 1024:g} GiB" if mib >= 1024 else f"{mib} MiB"


def fill_bandwidth_rows(rows: dict[str, Row], rid_pin: str, rid_page: str, m: dict[str, Any]) -> None:
    ratio_row(rows[rid_pin], m["hostreg"], m["pin_memory"], "hostreg", "pin_memory", TARGET_VS_PINNED)
    ratio_row(rows[rid_page], m["hostreg"], m["pageable"], "hostreg", "pageable", TARGET_VS_PAGEABLE)
    for rid in (rid_pin, rid_page):
        if not m["hostreg_values_ok"] or not m["hostreg_pinned"]:
            rows[rid].result = "FAIL"
            rows[rid].figure += f"; staged values ok {m['hostreg_values_ok']}, pinned {m['hostreg_pinned']}"
        if not m["hostreg_shared"]:
            rows[rid].figure += " (unshared arena: /dev/shm too small)"


def step_bandwidth(ctx: Ctx, rows: dict[str, Row]) -> None:
    torch = ctx.torch
    a = ctx.args
    raise_memlock_limit()
    size_label = size_text(a.size_mib)
    measured: dict[str, dict[str, Any]] = {}
    ctx.report.data["bandwidth"] = measured

    # One tensor of --size-mib bytes.
    src = torch.randint(0, 256, (a.size_mib * MiB,), dtype=torch.uint8, device=ctx.device)
    measured[size_label] = measure_kinds(ctx, size_label, {"x": src})
    del src
    fill_bandwidth_rows(rows, "5a", "5b", measured[size_label])
    # A GPT-2-shaped state dict built on the device.
    sd = model_state_dict(ctx, a.model)
    measured[a.model] = measure_kinds(ctx, a.model, sd)
    fill_bandwidth_rows(rows, "5c", "5d", measured[a.model])

    figures = []
    for what, m in measured.items():
        if m.get("mlock"):
            figures.append(f"{m['mlock']:.1f} GB/s ({m['mlock'] / m['pin_memory']:.2f}x pin_memory) {what}")
        else:
            figures.append(f"{what}: {m.get('mlock_error')}")
    rows["5e"].result = "INFO"
    rows["5e"].figure = "; ".join(figures) + " (no target)"

    # Time to a usable staged copy, PyTorch's path vs hostreg's.
    need = aligned_total(list(sd.values()))
    if shm_free() < need * 1.05 + 64 * MiB:
        rows["5f"].result = "SKIP"
        rows["5f"].figure = f"/dev/shm has {shm_free() / GiB:.1f} GiB free, staging needs {need / GiB:.1f} GiB (shared memory)"
        return
    # Warm-up on the 8 smallest tensors, so that neither path is charged one-time setup.
    small = dict(sorted(sd.items(), key=lambda kv: kv[1].nbytes)[:8])
    stage_times(ctx, small)
    t_torch, t_hostreg, problems = stage_times(ctx, sd)
    ctx.report.data["staging"] = {"torch_s": t_torch, "hostreg_s": t_hostreg, "bytes": need, "problems": problems}
    ratio = t_torch / t_hostreg
    rows["5f"].result = "PASS" if ratio >= TARGET_STAGING and not problems else "FAIL"
    rows["5f"].figure = "; ".join(problems + [f"{ratio:.1f}x faster (hostreg {t_hostreg:.3g} s vs torch {t_torch:.3g} s), target >= {TARGET_STAGING:g}x"])
    del sd
    gc.collect()


# ---- driver ------------------------------------------------------------------------------------


@dataclass
class Step:
    number: str
    rows: list[tuple[str, str]]
    run: Callable[[Ctx, dict[str, Row]], None]
    needs_build: bool = True


STEPS = [
    Step("1", [("1a", "build (cmake Release, nanobind extension)"), ("1b", "import hostreg, hostreg.torch without rich")], step_build, needs_build=False),
    Step("2", [("2", "differential codes vs CUDA runtime")], step_conformance),
    Step("3", [("3", "hostreg-registered memory seen as pinned")], step_registration),
    Step(
        "4",
        [
            ("4a", "torch _create_cpu_state_dict, cudart()=None"),
            ("4b", "hostreg create/copy_state_dict from device"),
            ("4c", "hostreg.torch.Stager, stage twice"),
            ("4d", "Stager(async_staging=True) from device"),
        ],
        step_scenario,
    ),
    Step(
        "5",
        [
            ("5a", "D2H SIZE: hostreg vs pin_memory"),
            ("5b", "D2H SIZE: hostreg vs pageable"),
            ("5c", "D2H MODEL: hostreg vs pin_memory"),
            ("5d", "D2H MODEL: hostreg vs pageable"),
            ("5e", "D2H into mlock-only memory"),
            ("5f", "time to stage MODEL: hostreg vs torch"),
        ],
        step_bandwidth,
    ),
]


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="gpu_check.py",
        description="Verify hostreg's cuda backend on an NVIDIA GPU (normally run by scripts/gpu_check.sh).",
    )
    p.add_argument("--dry-run", action="store_true", help="no GPU: CUDA driver test double, expected-code table, CPU tensors, fake timer")
    p.add_argument("--steps", default="1,2,3,4,5", help="comma-separated steps to run (default: all)")
    p.add_argument("--log-dir", type=Path, help="where check.log, results.json, table.txt go (default $OUT/gpu_check, else build/gpu/logs)")
    p.add_argument("--build-status", choices=["PASS", "FAIL", "INFO"], help="result of the build (set by gpu_check.sh)")
    p.add_argument("--build-detail", default="", help="key figure of the build row (set by gpu_check.sh)")
    p.add_argument("--expect-package", help="directory hostreg must be imported from (the fresh build)")
    p.add_argument("--size-mib", type=int, help="bytes of the single-tensor D2H test, in MiB (default 1024; dry run 4)")
    p.add_argument("--model", help="GPT-2 shape from hostreg.models for step 5 (default gpt2-xl; dry run tiny)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement, median taken (>= 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed copies before timing (default 2)")
    p.add_argument("--check-args", action="store_true", help="only validate the arguments (gpu_check.sh does, before building)")
    p.add_argument("--fake-gbps", action="append", default=[], metavar="KIND=GBPS", help=f"dry run: override a fake rate ({', '.join(FAKE_GBPS)})")
    a = p.parse_args(argv)

    steps = [s.strip() for s in a.steps.split(",") if s.strip()]
    known = [s.number for s in STEPS]
    if not steps or any(s not in known for s in steps):
        p.error(f"--steps takes a comma-separated subset of {','.join(known)}, got {a.steps!r}")
    a.steps = steps
    if a.repeats < 5:
        p.error(f"--repeats must be >= 5 (median of at least 5), got {a.repeats}")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    fake: dict[str, float] = {}
    for item in a.fake_gbps:
        kind, _, value = item.partition("=")
        try:
            fake[kind] = float(value)
        except ValueError:
            p.error(f"--fake-gbps takes KIND=GBPS, got {item!r}")
        if kind not in FAKE_GBPS or fake[kind] <= 0:
            p.error(f"--fake-gbps: kind must be one of {', '.join(FAKE_GBPS)} with a rate > 0, got {item!r}")
    if fake and not a.dry_run:
        p.error("--fake-gbps is for --dry-run only")
    a.fake_gbps = fake
    if a.size_mib is None:
        a.size_mib = 4 if a.dry_run else 1024
    if a.size_mib <= 0:
        p.error("--size-mib must be > 0")
    a.model = a.model or ("tiny" if a.dry_run else "gpt2-xl")
    known_models = ["tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]  # hostreg.models.MODELS
    if a.model not in known_models:
        p.error(f"--model must be one of {', '.join(known_models)}, got {a.model!r}")
    if a.log_dir is None:
        out = os.environ.get("OUT")
        a.log_dir = Path(out) / "gpu_check" if out else REPO / "build" / ("gpu-dry" if a.dry_run else "gpu") / "logs"
    return a


def setup_environment(a: argparse.Namespace) -> None:
    """Before hostreg is first used: the cuda backend, and in a dry run the driver double."""
    os.environ.setdefault("HOSTREG_BACKEND", "cuda")
    if a.dry_run and not os.environ.get("HOSTREG_CUDA_LIBRARY"):
        for cand in (REPO / "build/gpu-dry/doubles/libhostreg_double_cuda.so", REPO / "build/cpp/tests/doubles/libhostreg_double_cuda.so"):
            if cand.is_file():
                os.environ["HOSTREG_CUDA_LIBRARY"] = str(cand)
                break
        else:
            raise SystemExit("gpu_check.py --dry-run: no CUDA driver double; run scripts/gpu_check.sh --dry-run (builds it) or set HOSTREG_CUDA_LIBRARY")


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    if a.check_args:
        return 0
    setup_environment(a)
    report = Report(a.log_dir)
    report.log(f"argv: {argv}; python {sys.version.split()[0]}; HOSTREG_BACKEND={os.environ.get('HOSTREG_BACKEND')} HOSTREG_CUDA_LIBRARY={os.environ.get('HOSTREG_CUDA_LIBRARY')}")
    mode = "DRY RUN (no GPU: CUDA driver test double, expected codes, CPU tensors, fake timer)" if a.dry_run else "GPU run"
    report.say(f"gpu_check: {mode}; logs in {a.log_dir}")

    selected = [s for s in STEPS if s.number in a.steps]
    ctx: Optional[Ctx] = None
    interrupted = False
    build_failed = a.build_status == "FAIL"
    for step in selected:
        rows = {rid: Row(rid, check.replace("SIZE", size_text(a.size_mib)).replace("MODEL", a.model)) for rid, check in step.rows}
        report.rows.extend(rows.values())
        if interrupted or (build_failed and step.needs_build):
            for r in rows.values():
                r.result, r.figure = "SKIP", "not run: " + ("time limit" if interrupted else "build failed")
            continue
        report.say(f"step {step.number} ...")
        t0 = time.perf_counter()
        try:
            if ctx is None:
                ctx = Ctx(a, report)
            if step.needs_build:
                ctx.torch  # noqa: B018 (torch first, then hostreg.torch, as applications do)
            step.run(ctx, rows)
        except KeyboardInterrupt:  # gpu_check.sh's time limit sends SIGINT
            interrupted = True
            report.log(traceback.format_exc())
            for r in rows.values():
                if r.figure == "not reported":
                    r.result, r.figure = "FAIL", "interrupted (time limit)"
        except Exception as e:  # noqa: BLE001 (a failing step must not hide the others)
            report.log(f"step {step.number} raised:\n{traceback.format_exc()}")
            msg = f"error: {type(e).__name__}: {e}".replace("\n", " ")
            for r in rows.values():
                if r.figure == "not reported":
                    r.result, r.figure = "FAIL", msg[:160]
        finally:
            gc.collect()
        report.log(f"step {step.number} took {time.perf_counter() - t0:.1f} s")
        if ctx is not None and step.needs_build:
            import hostreg

            left = hostreg.stats().registrations
            if left:
                report.say(f"  note: {left} hostreg registrations live after step {step.number}: {hostreg.registrations()[:3]}")

    table = report.table()
    report.close(table)
    print("", flush=True)
    print(table, flush=True)
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
