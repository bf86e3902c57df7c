"""Backend selection, vendor backends against their test doubles, and ``hostreg doctor``.

Each case runs in a fresh interpreter: the backend is chosen once per process.
The doubles (tests/doubles, built by scripts/test into build/cpp) implement the vendors'
documented C ABIs; they are not the vendors' libraries.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, low_memlock, run_python, table_row

HOSTREG = str(Path(sys.executable).parent / "hostreg")
DOUBLES = Path(os.environ.get("HOSTREG_DOUBLES_DIR", REPO / "build/cpp/tests/doubles"))
VENDORS = {
    "cuda": ("HOSTREG_CUDA_LIBRARY", "libhostreg_double_cuda.so"),
    "hip": ("HOSTREG_HIP_LIBRARY", "libhostreg_double_hip.so"),
    "acl": ("HOSTREG_ACL_LIBRARY", "libhostreg_double_acl.so"),
    "ze": ("HOSTREG_ZE_LIBRARY", "libhostreg_double_ze.so"),
    "musa": ("HOSTREG_MUSA_LIBRARY", "libhostreg_double_musa.so"),
}
NO_OVERRIDES = {k: "" for k in ("HOSTREG_BACKEND", *(var for var, _ in VENDORS.values()))}


def double_env(backend: str, lib: str | None = None, **extra: str) -> dict[str, str]:
    var, name = VENDORS[backend]
    path = DOUBLES / (lib or name)
    assert path.is_file(), f"{path} is missing: build the doubles (scripts/test does) or set HOSTREG_DOUBLES_DIR"
    return {"HOSTREG_BACKEND": backend, var: str(path), **extra}


def probe(env: dict[str, str]) -> dict:
    code = "import json, hostreg; from hostreg import _hostreg as h; print(json.dumps({'backend': hostreg.backend(), 'probe': {n: h.probe_backend(n) for n in h.backend_names()}, 'last': h.last_error()}))"
    r = run_python(code, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def doctor(env: dict[str, str], *prefix: str) -> tuple[int, dict]:
    r = subprocess.run(
        [*prefix, HOSTREG, "doctor", "--json"], capture_output=True, text=True, env={**os.environ, **env}, timeout=120
    )
    return r.returncode, json.loads(r.stdout)


def test_auto_on_this_machine_is_posix_with_reasons_for_the_rest():
    rc, d = doctor(NO_OVERRIDES)
    assert rc == 0 and d["ok"]
    assert d["auto"] == d["active"] == "posix"
    by_name = {b["name"]: b for b in d["backends"]}
    assert list(by_name) == ["cuda", "hip", "acl", "ze", "musa", "posix"]
    for name in ("cuda", "hip", "acl", "ze", "musa"):  # hip and ze: see test_real_runtimes.py
        assert not by_name[name]["available"] and by_name[name]["detail"], name
    for name, lib in [("cuda", "libcuda.so.1"), ("acl", "libascendcl.so"), ("musa", "libmusart.so")]:
        assert lib in by_name[name]["detail"]
    assert by_name["posix"]["available"] and by_name["posix"]["granule"] == os.sysconf("SC_PAGESIZE")


@pytest.mark.parametrize("backend", list(VENDORS))
def test_each_double_is_selected_by_name(backend: str):
    env = double_env(backend)
    p = probe(env)
    assert p["backend"] == backend
    code, detail = p["probe"][backend]
    assert code == 0 and env[VENDORS[backend][0]] in detail


def test_auto_prefers_an_available_accelerator():
    env = double_env("cuda", HOSTREG_BACKEND="auto")
    assert probe(env)["backend"] == "cuda"


def test_stub_driver_is_unavailable_and_auto_falls_through():
    env = double_env("cuda", HOSTREG_BACKEND="auto", HOSTREG_DOUBLE_STUB="1")
    p = probe(env)
    assert p["backend"] == "posix"
    code, detail = p["probe"]["cuda"]
    assert code == 34 and "cuInit failed" in detail and "is the toolkit's stub, not a driver" in detail


def test_no_device_is_unavailable():
    for backend in VENDORS:
        p = probe(double_env(backend, HOSTREG_BACKEND="auto", HOSTREG_DOUBLE_DEVICES="0"))
        assert p["backend"] == "posix", backend
        code, detail = p["probe"][backend]
        assert code != 0 and detail, backend


def test_forced_backend_that_cannot_load_gives_none_and_code_3():
    env = {"HOSTREG_BACKEND": "cuda", "HOSTREG_CUDA_LIBRARY": "/nonexistent/libcuda.so.1"}
    code = "import hostreg, mmap, ctypes; b = mmap.mmap(-1, 4096); a = ctypes.addressof(ctypes.c_char.from_buffer(b)); print(hostreg.backend(), int(hostreg.host_register(a, 10)), hostreg.last_error().message)"
    r = run_python(code, env=env)
    assert r.returncode == 0, r.stderr
    name, rc, message = r.stdout.split(" ", 2)
    assert (name, rc) == ("none", "3")
    assert "backend cuda (HOSTREG_BACKEND) is unavailable" in message and "/nonexistent/libcuda.so.1" in message


def test_relative_library_paths_are_refused():
    p = probe({"HOSTREG_BACKEND": "auto", "HOSTREG_ACL_LIBRARY": "libhostreg_double_acl.so"})
    code, detail = p["probe"]["acl"]
    assert code == 3 and "not an absolute path" in detail


@pytest.mark.parametrize("value, code, words", [("none", 801, "disabled"), ("bogus", 3, "unknown backend 'bogus'")])
def test_none_and_unknown_backend(value: str, code: int, words: str):
    src = "import hostreg, mmap, ctypes; b = mmap.mmap(-1, 4096); a = ctypes.addressof(ctypes.c_char.from_buffer(b)); print(int(hostreg.host_register(a, 10)), hostreg.last_error().message)"
    r = run_python(src, env={"HOSTREG_BACKEND": value})
    rc, message = r.stdout.split(" ", 1)
    assert int(rc) == code and words in message


# ---- AscendCL: the device a registration is for, from every thread ---------------------------
#
# CANN's contexts are per thread (hicann/runtime api_impl.cc: ApiImpl::SetDevice keeps the
# context thread-locally; GetDevice answers 107002 on a thread that set none), and a
# registration is for the device of the calling thread's context. The double models both and
# says which device each registration is for (hostreg_double_acl_device_of) and how many
# contexts each device has (hostreg_double_acl_context_refs).

ACL_PRELUDE = """
import ctypes, mmap, os, threading
import hostreg
acl = ctypes.CDLL(os.environ["HOSTREG_ACL_LIBRARY"])  # the double hostreg loaded: the same library
acl.aclInit(None)
buf = mmap.mmap(-1, 1 << 20); addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
def on_new_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn())); t.start(); t.join()
    return out[0]
def report(code):
    return f"{int(code)} dev={acl.hostreg_double_acl_device_of(ctypes.c_void_p(addr))} ctx0={acl.hostreg_double_acl_context_refs(0)}"
"""


def acl_run(body: str, **env: str) -> list[str]:
    r = run_python(ACL_PRELUDE + body, env=double_env("acl", HOSTREG_DOUBLE_DEVICES="2", **env))
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_acl_registers_on_a_staging_thread_for_the_device_its_caller_uses():
    # Rank 1 of a node: the training thread is on NPU 1; hostreg's Stager is made there, and
    # the first registration happens on a thread with no context of its own.
    out = acl_run("""
acl.aclrtSetDevice(1)
import hostreg.torch as ht, torch
stager = ht.Stager(async_staging=True)
staged = stager.stage({"w": torch.ones(1 << 18)}).result()
from hostreg import _core
reg = _core.registration(staged["w"].data_ptr())
print(acl.hostreg_double_acl_device_of(ctypes.c_void_p(reg.base)) if reg else "not registered", acl.hostreg_double_acl_context_refs(0))
del staged; stager.close()
""")
    assert out == ["1 0"], "registered for NPU 1, and no context was made on NPU 0"


def test_acl_refuses_a_thread_without_a_context_when_the_device_is_unknown():
    out = acl_run("""
code, message = on_new_thread(lambda: (hostreg.host_register(addr, 1 << 20), hostreg.last_error().message))
print(report(code))
print(message)
print(hostreg.stats().registrations)
""")
    assert out[0] == "201 dev=-1 ctx0=0", "refused (cudaErrorDeviceUninitialized), no context made on NPU 0"
    assert "does not know which NPU this process uses" in out[1] and "does not guess NPU 0" in out[1]
    assert out[2] == "0"


def test_acl_set_default_device_names_the_device_for_threads_without_one():
    out = acl_run("""
print(int(hostreg.set_default_device(5)), int(hostreg.set_default_device(1)))
print(report(on_new_thread(lambda: hostreg.host_register(addr, 1 << 20))))
print(int(on_new_thread(lambda: hostreg.host_unregister(addr))), acl.hostreg_double_acl_device_of(ctypes.c_void_p(addr)))
print(int(hostreg.set_default_device(None)))  # this thread has no context: an answer
try:
    hostreg.set_default_device(-2)
except ValueError as e:
    print("ValueError")
""")
    assert out[0] == "101 0", "NPU 5 does not exist (2 NPUs): cudaErrorInvalidDevice"
    assert out[1] == "0 dev=1 ctx0=0"
    assert out[2] == "0 -1", "unregistered, on its own device"
    assert out[3] == "201" and out[4] == "ValueError"


def test_acl_learns_the_device_from_the_first_thread_that_uses_hostreg_with_one():
    out = acl_run("""
acl.aclrtSetDevice(1)
print(int(hostreg.host_register(addr, 4096)), int(hostreg.host_unregister(addr)))  # learns NPU 1 here
print(report(on_new_thread(lambda: hostreg.host_register(addr, 1 << 20))))
""")
    assert out == ["0 0", "0 dev=1 ctx0=0"]


def test_acl_takes_torch_npus_device_on_a_staging_thread():
    # A stand-in for torch_npu's Python API, as torch_npu/npu/utils.py defines it:
    # is_initialized() (NPU state initialised) and current_device() (torch_npu._C._npu_getDevice,
    # torch_npu's own choice of device for the calling thread). Not torch_npu.
    out = acl_run("""
import sys, types, torch
sys.modules["torch_npu"] = types.ModuleType("torch_npu")
torch.npu = types.SimpleNamespace(is_initialized=lambda: True, current_device=lambda: 1)
print(report(on_new_thread(lambda: hostreg.cudart().cudaHostRegister(addr, 1 << 20, 0))))
""")
    assert out == ["0 dev=1 ctx0=0"]


def test_acl_unregister_on_another_npu_restores_the_threads_context_without_a_retain():
    # The registration is for NPU 0; the unregistering thread is on NPU 1. AscendCL undoes it
    # for the current context's device, so hostreg switches to NPU 0 and back: back with
    # aclrtSetCurrentContext (aclrtSetDevice would retain NPU 1's primary context again each
    # time: runtime.cc, PrimaryContextRetain).
    out = acl_run("""
hostreg.set_default_device(0)
print(int(on_new_thread(lambda: hostreg.host_register(addr, 1 << 20))))
acl.aclrtSetDevice(1)
ctx = ctypes.c_void_p(); acl.aclrtGetCurrentContext(ctypes.byref(ctx)); before = ctx.value
refs = acl.hostreg_double_acl_context_refs(1)
print(int(hostreg.host_unregister(addr)), acl.hostreg_double_acl_device_of(ctypes.c_void_p(addr)))
acl.aclrtGetCurrentContext(ctypes.byref(ctx))
print(ctx.value == before, acl.hostreg_double_acl_context_refs(1) - refs)
""")
    assert out == ["0", "0 -1", "True 0"], "undone on NPU 0; NPU 1's context back, not retained again"


def test_acl_portable_is_refused_once_the_process_uses_a_second_npu():
    # CUDA's Portable means every device; AscendCL registers for the calling thread's NPU only
    # (api_impl.cc: HostRegisterV2 passes CurrentContext()->Device_()). PyTorch's flag 1 works
    # while the process uses one NPU.
    out = acl_run("""
acl.aclrtSetDevice(1)
b2 = mmap.mmap(-1, 1 << 20); a2 = ctypes.addressof(ctypes.c_char.from_buffer(b2))
print(int(hostreg.host_register(addr, 1 << 20, 1)), int(hostreg.host_unregister(addr)))  # Portable, one NPU in use
def on_npu0():
    acl.aclrtSetDevice(0)
    return int(hostreg.host_register(a2, 1 << 20, 0))  # now the process uses NPU 0 too
print(on_new_thread(on_npu0))
print(int(hostreg.host_register(addr, 1 << 20, 1)), hostreg.last_error().message)
print(int(hostreg.host_register(addr, 1 << 20, 0)), int(hostreg.host_unregister(addr)))  # without Portable: fine
print(on_new_thread(lambda: (acl.aclrtSetDevice(0), int(hostreg.host_unregister(a2)))[1]))
""")
    assert out[0] == "0 0" and out[1] == "0"
    code, message = out[2].split(" ", 1)
    assert code == "801" and "registers for one NPU (this thread's, NPU 1)" in message and "NPU 0 too" in message
    assert out[3] == "0 0" and out[4] == "0"


@pytest.mark.skipif(shutil.which("setarch") is None, reason="needs setarch (util-linux) for the UNAME26 personality")
def test_acl_is_unavailable_on_kernels_5_10_or_older():
    # setarch --uname-2.6 gives the process the UNAME26 personality: uname(2) reports a 2.6
    # kernel. CANN's API docs (aclrtHostRegister / V2, ptr): on kernels 5.10 or older,
    # registering memory aclrtMallocHost did not allocate causes exceptions.
    old = ("setarch", platform.machine(), "--uname-2.6")
    code = "import json, hostreg; from hostreg import _hostreg as h; print(json.dumps([h.probe_backend('acl'), hostreg.backend()]))"
    r = run_python(code, *old, env=double_env("acl", HOSTREG_BACKEND="auto"))
    assert r.returncode == 0, r.stderr
    (rc, detail), active = json.loads(r.stdout)
    assert rc == 801 and "is 5.10 or older" in detail and "aclrtMallocHost" in detail
    assert active == "posix", "auto falls back to the OS's page lock"
    r = run_python(code, env=double_env("acl", HOSTREG_BACKEND="auto"))  # this machine's own kernel
    assert json.loads(r.stdout)[0][0] == 0 and json.loads(r.stdout)[1] == "acl"


# ---- Level Zero: imports made by someone else, a driver that refuses imports -----------------
#
# compute-runtime's host_pointer_manager.cpp answers SUCCESS, creating nothing, for a range
# inside an existing import, and its release frees the import containing the pointer; other
# users of the driver (SYCL, oneCCL) import too. The double models both, and hands out
# zexDriverGetHostPointerBaseAddress as driver_handle.cpp does.

ZE_PRELUDE = """
import ctypes, mmap, os
import hostreg
ze = ctypes.CDLL(os.environ["HOSTREG_ZE_LIBRARY"])  # the double hostreg loaded: the same library
ze.zeInit(0)
count = ctypes.c_uint32(1); drivers = (ctypes.c_void_p * 1)()
ze.zeDriverGet(ctypes.byref(count), drivers)
drv = ctypes.c_void_p(drivers[0])
def ext(name, *argtypes):
    fn = ctypes.c_void_p()
    assert ze.zeDriverGetExtensionFunctionAddress(drv, name.encode(), ctypes.byref(fn)) == 0
    return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(fn.value)
import_ = ext("zexDriverImportExternalPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
release = ext("zexDriverReleaseImportedPointer", ctypes.c_void_p, ctypes.c_void_p)
base_of = ext("zexDriverGetHostPointerBaseAddress", ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
buf = mmap.mmap(-1, 1 << 20); addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
"""


def test_ze_refuses_a_range_someone_else_imported_and_leaves_their_import():
    r = run_python(
        ZE_PRELUDE
        + """
print(import_(drv, addr, 1 << 20))  # another user of the driver (SYCL's prepare_for_device_copy)
print(int(hostreg.host_register(addr + 8192, 8192)), hostreg.last_error().message)
b = ctypes.c_void_p(); print(base_of(drv, ctypes.c_void_p(addr + 8192), ctypes.byref(b)), b.value == addr)
print(release(drv, ctypes.c_void_p(addr)), hostreg.stats().registrations)
print(int(hostreg.host_register(addr + 8192, 8192)), int(hostreg.host_unregister(addr + 8192)))  # theirs gone: hostreg's own
""",
        env=double_env("ze"),
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "0"
    code, message = out[1].split(" ", 1)
    assert code == "712" and "already imported into the Level Zero driver by another user" in message
    assert out[2] == "0 True", "the other user's import is untouched"
    assert out[3] == "0 0" and out[4] == "0 0"


def test_ze_driver_that_refuses_imports_is_unavailable():
    # compute-runtime with EnableHostPointerImport=0 still hands out the zex functions
    # (extension_function_address.cpp) but every import answers UNSUPPORTED_FEATURE.
    p = probe(double_env("ze", HOSTREG_DOUBLE_ZE_NO_IMPORT="1"))
    code, detail = p["probe"]["ze"]
    assert code == 801 and "refuses it" in detail and "EnableHostPointerImport=0" in detail
    rc, d = doctor(double_env("ze", HOSTREG_DOUBLE_ZE_NO_IMPORT="1", HOSTREG_BACKEND="auto"))
    assert d["active"] == "posix"


def test_acl_codes_reach_callers_as_cudas_with_native_kept():
    # Through the AscendCL double, with a 64 KiB memlock limit: its driver cannot lock, answers
    # 207001, and the caller gets cudaErrorMemoryAllocation (2) with AscendCL's number and text.
    src = """
import hostreg, mmap, ctypes
b = mmap.mmap(-1, 1 << 20); a = ctypes.addressof(ctypes.c_char.from_buffer(b))
hostreg.set_default_device(0)  # the process's NPU (this thread has no context)
print(int(hostreg.host_register(a, 1 << 20)))
e = hostreg.last_error(); print(e.native, e.message)
print(int(hostreg.host_register(a + 7, 100)), hostreg.stats().registrations)
"""
    r = run_python(src, *low_memlock(64), env=double_env("acl", "libhostreg_double_acl_v1.so"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "2" and lines[1].startswith("207001 aclrtHostRegister failed: aclError 207001"), lines
    assert lines[2] == "0 1", "an unaligned range registers too, in whole 4 KiB pages"


def test_doctor_with_low_memlock_predicts_failure():
    rc, d = doctor({"HOSTREG_BACKEND": "posix"}, *low_memlock(8192))
    assert rc == 1 and not d["ok"]
    assert any("RLIMIT_MEMLOCK is 8192 KiB" in p for p in d["problems"])


@pytest.mark.parametrize(
    "args, limited",
    [(["doctor"], False), (["doctor"], True), (["doctor", "--json"], True), (["stage", "--model", "tiny"], False)],
    ids=["doctor-works", "doctor-would-fail", "json-would-fail", "stage"],
)
def test_a_closed_pipe_keeps_the_verdict(args: list[str], limited: bool):
    # The reader is gone before anything is written (`hostreg doctor | true`): every write
    # fails with EPIPE; the exit code is still the command's own verdict, with no traceback.
    prefix = low_memlock(64) if limited else ()
    p = subprocess.Popen(
        [*prefix, HOSTREG, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "HOSTREG_BACKEND": "posix"},
    )
    p.stdout.close()
    _, err = p.communicate(timeout=300)
    assert p.returncode == (1 if limited else 0), err
    assert b"Traceback" not in err


def test_doctor_table_names_the_posix_caveat():
    r = subprocess.run(
        [HOSTREG, "doctor"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "HOSTREG_BACKEND": "posix"},
    )
    assert r.returncode == 0
    assert "not registered with any device's DMA engine" in r.stdout and "verdict: staging" in r.stdout


REPORT_IN_A_PROGRAM = r"""
import io, json, sys
import torch, torch.cuda
import hostreg.doctor

def report(title):
    out = io.StringIO()
    d = hostreg.doctor.report(4096, file=out, width=80)
    print(json.dumps({"title": title, "text": out.getvalue(), "dropin": d.dropin, "now": d.pytorch_cudart,
                      "own": d.torch_cudart, "warnings": d.warnings, "problems": d.problems}))

torch.cuda.is_initialized = lambda: True   # what Ascend's transfer_to_npu does: torch's cudart() returns None
report("ascend")
import hostreg.auto                          # the fix the report names
report("fixed")
torch.cuda.cudart = lambda: None             # something replaces torch.cuda.cudart after the drop-in
report("replaced")
"""


def test_doctor_report_in_the_program_sees_the_ascend_state_and_the_dropin():
    r = run_python(REPORT_IN_A_PROGRAM, env={"HOSTREG_BACKEND": "posix"})
    assert r.returncode == 0, r.stderr
    ascend, fixed, replaced = (json.loads(line) for line in r.stdout.splitlines())
    # Before: torch's cudart() returns None, PyTorch's pinning would crash, and the report says
    # with what and how to fix it; hostreg's own staging would still work.
    assert ascend["own"] == ascend["now"] == "returns None" and ascend["dropin"] == "not installed"
    assert not ascend["problems"] and len(ascend["warnings"]) == 1
    warning = " ".join(ascend["text"].split())  # the text as printed, its line breaks aside
    assert (
        "will fail in this process with AttributeError: 'NoneType' object has no attribute 'cudaHostRegister'"
        in warning
    )
    assert "`import hostreg.auto`" in warning and "would work (posix backend)" in warning
    # After `import hostreg.auto`: installed, PyTorch's code gets hostreg's cudart, no warning.
    assert fixed["own"] in (
        "returns None",
        "returns torch.cuda._cudart, which hostreg's drop-in set (a CPU build of torch leaves it None)",
    )
    assert fixed["dropin"].startswith("installed: ")
    assert fixed["now"] == "hostreg's cudart, through the drop-in (torch has no CUDA runtime here)"
    assert fixed["warnings"] == []
    assert "warning" not in fixed["text"]
    # Replaced afterwards: said, with the crash it leads to.
    assert fixed["dropin"] != replaced["dropin"] and "replaced after it" in replaced["dropin"]
    assert replaced["now"] == "returns None" and len(replaced["warnings"]) == 1
    # At 80 columns every line fits, and the reasons' column is wide enough to read a sentence
    # in (it was 14 characters: a word a line).
    lines = ascend["text"].splitlines()
    assert max(map(len, lines)) <= 80
    header = next(line for line in lines if "why not" in line)
    assert len(header.split("┃")[3]) >= 36, header


def test_doctor_command_says_it_is_a_process_of_its_own():
    r = subprocess.run(
        [HOSTREG, "doctor"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80", "HOSTREG_BACKEND": "posix"},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert table_row(r.stdout, "hostreg's drop-in") == "not installed"
    assert "when the program calls hostreg.doctor.report() after its setup" in " ".join(r.stdout.split())


@pytest.mark.parametrize("backend", list(VENDORS))
def test_stage_runs_through_each_double(backend: str):
    r = subprocess.run(
        [HOSTREG, "stage", "--model", "tiny"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **double_env(backend)},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert table_row(r.stdout, "backend") == backend
    assert table_row(r.stdout, "values verified") == "yes"


def test_stage_default_model_through_the_acl_double():
    r = subprocess.run(
        [HOSTREG, "stage"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **double_env("acl")},
        timeout=600,
    )
    assert r.returncode == 0, r.stderr
    assert table_row(r.stdout, "backend") == "acl"
    assert table_row(r.stdout, "tensors (registered)") == "148 (148)"
    assert table_row(r.stdout, "unregistered on release") == "yes"


def test_doctor_counts_whole_pages_and_refuses_bad_sizes():
    # 695,296 bytes need 761,856 locked in whole pages: a 704 KiB limit is not enough.
    r = subprocess.run(
        [
            "prlimit",
            "--memlock=720896:720896",
            "setpriv",
            "--bounding-set=-ipc_lock",
            "--",
            HOSTREG,
            "doctor",
            "--json",
            "--bytes",
            "695296",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "HOSTREG_BACKEND": "posix"},
    )
    assert r.returncode == 1 and "in whole pages" in json.loads(r.stdout)["problems"][0]
    r = subprocess.run([HOSTREG, "doctor", "--bytes", "-5"], capture_output=True, text=True)
    assert r.returncode == 2 and "--bytes must be > 0" in r.stderr


def test_doctor_reports_an_invalid_max_registration_as_staging_does(monkeypatch):
    from hostreg import doctor as doctor_module

    for value in ("abc", "0", "-5", "12x"):  # read at each call, by staging's own parser
        monkeypatch.setenv("HOSTREG_MAX_REGISTRATION", value)
        problems = doctor_module.verdict(doctor_module.diagnose(4096))
        assert any(f"HOSTREG_MAX_REGISTRATION={value} is not a positive number of bytes" in p for p in problems), value
    monkeypatch.setenv("HOSTREG_MAX_REGISTRATION", "1048576")
    assert not [p for p in doctor_module.verdict(doctor_module.diagnose(4096)) if "HOSTREG_MAX_REGISTRATION" in p]
    env = {"HOSTREG_BACKEND": "posix", "HOSTREG_MAX_REGISTRATION": "abc"}  # and hostreg stage says the same
    r = subprocess.run(
        [HOSTREG, "stage", "--model", "tiny"], capture_output=True, text=True, env={**os.environ, **env}, timeout=300
    )
    assert r.returncode == 1 and "HOSTREG_MAX_REGISTRATION=abc is not a positive number of bytes" in r.stderr


def test_doctor_command_runs_where_torch_is_not_installed():
    """The command line (``hostreg doctor``, ``--help``, ``python -m hostreg``) needs no torch: a
    wheel installed without it must still diagnose. torch is made unimportable here (a
    ``sys.modules`` entry of None makes ``import torch`` raise ImportError)."""
    code = """
import sys
sys.modules["torch"] = None
from hostreg import cli
for argv in (["--help"], ["doctor"]):
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's --help
        rc = e.code
    print("RC", argv[0], rc)
print("TORCH", "torch" in sys.modules and sys.modules["torch"] is not None)
"""
    r = run_python(code, env={"COLUMNS": "120", "HOSTREG_BACKEND": "posix"})
    assert r.returncode == 0, r.stderr
    assert "RC --help 0" in r.stdout and "RC doctor 0" in r.stdout and "TORCH False" in r.stdout, r.stdout + r.stderr
    assert "not installed" in r.stdout, "the torch row says it is missing"
    m = subprocess.run([sys.executable, "-m", "hostreg", "--help"], capture_output=True, text=True, timeout=120)
    assert m.returncode == 0 and "doctor" in m.stdout, m.stderr
