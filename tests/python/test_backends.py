"""Backend selection, vendor backends against their test doubles, and ``hostreg doctor``.

Each case runs in a fresh interpreter: the backend is chosen once per process.
The doubles (tests/doubles, built by scripts/test into build/cpp) implement the vendors'
documented C ABIs; they are not the vendors' libraries.
"""

from __future__ import annotations

import json
import os
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
    r = subprocess.run([*prefix, HOSTREG, "doctor", "--json"], capture_output=True, text=True, env={**os.environ, **env}, timeout=120)
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


def test_acl_codes_reach_callers_as_cudas_with_native_kept():
    # Through the AscendCL double, with a 64 KiB memlock limit: its driver cannot lock, answers
    # 207001, and the caller gets cudaErrorMemoryAllocation (2) with AscendCL's number and text.
    src = """
import hostreg, mmap, ctypes
b = mmap.mmap(-1, 1 << 20); a = ctypes.addressof(ctypes.c_char.from_buffer(b))
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


def test_doctor_table_names_the_posix_caveat():
    r = subprocess.run([HOSTREG, "doctor"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200", "HOSTREG_BACKEND": "posix"})
    assert r.returncode == 0
    assert "not registered with any device's DMA engine" in r.stdout and "verdict: staging" in r.stdout


@pytest.mark.parametrize("backend", list(VENDORS))
def test_stage_runs_through_each_double(backend: str):
    r = subprocess.run(
        [HOSTREG, "stage", "--model", "tiny"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200", **double_env(backend)}, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert table_row(r.stdout, "backend") == backend
    assert table_row(r.stdout, "values verified") == "yes"


def test_stage_default_model_through_the_acl_double():
    r = subprocess.run(
        [HOSTREG, "stage"], capture_output=True, text=True, env={**os.environ, "COLUMNS": "200", **double_env("acl")}, timeout=600
    )
    assert r.returncode == 0, r.stderr
    assert table_row(r.stdout, "backend") == "acl"
    assert table_row(r.stdout, "tensors (registered)") == "148 (148)"
    assert table_row(r.stdout, "unregistered on release") == "yes"


def test_doctor_counts_whole_pages_and_refuses_bad_sizes():
    # 695,296 bytes need 761,856 locked in whole pages: a 704 KiB limit is not enough.
    r = subprocess.run(
        ["prlimit", "--memlock=720896:720896", "setpriv", "--bounding-set=-ipc_lock", "--", HOSTREG, "doctor", "--json", "--bytes", "695296"],
        capture_output=True, text=True, env={**os.environ, "HOSTREG_BACKEND": "posix"},
    )
    assert r.returncode == 1 and "in whole pages" in json.loads(r.stdout)["problems"][0]
    r = subprocess.run([HOSTREG, "doctor", "--bytes", "-5"], capture_output=True, text=True)
    assert r.returncode == 2 and "--bytes must be > 0" in r.stderr
