"""hostreg against the vendors' real runtime binaries this machine can have.

Debian's ROCm 5.2 HIP runtime (libamdhip64-5), the Level Zero loader (libze1) and the CUDA
toolkit's libcudart.so.13 load here, with no GPU: hostreg must load them, report each one
unavailable with the vendor's own answer (from the real hipGetDeviceCount, the real zeInit),
never crash, show the real file and version in ``hostreg doctor``, and let ``auto`` fall
through to posix. Where a runtime is not installed the test is skipped, except under CI
(``CI`` set), whose setup installs them: there a missing runtime fails.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import run_python
from test_backends import NO_OVERRIDES, doctor, probe

HIP = Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5")
ZE = Path("/usr/lib/x86_64-linux-gnu/libze_loader.so.1")
CUDART = Path("/usr/local/cuda/lib64/libcudart.so.13")


def need(path: Path, package: str) -> None:
    if path.exists():
        return
    if os.environ.get("CI"):
        pytest.fail(f"{path} is missing: CI installs {package} (scripts/setup)")
    pytest.skip(f"{path} is not installed ({package})")


def test_real_hip_runtime_reports_no_device_in_its_own_words():
    need(HIP, "Debian libamdhip64-5")
    p = probe(NO_OVERRIDES)
    assert p["backend"] == "posix"
    code, detail = p["probe"]["hip"]
    assert code == 100 and "hipGetDeviceCount failed: hipErrorNoDevice (100)" in detail, detail
    rc, d = doctor(NO_OVERRIDES)
    hip = next(b for b in d["backends"] if b["name"] == "hip")
    assert hip["library"] == os.path.realpath(HIP) and hip["version"].startswith("HIP 5.2."), hip


def test_real_level_zero_loader_reports_no_driver_in_its_own_words():
    need(ZE, "Debian libze1")
    p = probe(NO_OVERRIDES)
    code, detail = p["probe"]["ze"]
    assert code == 3 and "zeInit failed: ze_result_t 0x78000001" in detail and "ZE_RESULT_ERROR_UNINITIALIZED" in detail
    rc, d = doctor(NO_OVERRIDES)
    ze = next(b for b in d["backends"] if b["name"] == "ze")
    assert ze["library"] == os.path.realpath(ZE), ze


@pytest.mark.parametrize("backend", ["hip", "ze"])
def test_forcing_a_real_runtime_without_a_device_answers_its_code(backend: str):
    need(HIP if backend == "hip" else ZE, "Debian libamdhip64-5 / libze1")
    src = "import hostreg, mmap, ctypes; b = mmap.mmap(-1, 4096); a = ctypes.addressof(ctypes.c_char.from_buffer(b)); print(hostreg.backend(), int(hostreg.host_register(a, 10)), hostreg.last_error().message)"
    r = run_python(src, env={**NO_OVERRIDES, "HOSTREG_BACKEND": backend})
    assert r.returncode == 0, r.stderr
    name, rc, message = r.stdout.split(" ", 2)
    assert name == "none" and rc == "3" and f"backend {backend} (HOSTREG_BACKEND) is unavailable" in message


def test_the_cuda_runtime_library_is_not_taken_for_the_driver():
    # hostreg's cuda backend uses the driver API; handed the toolkit's libcudart.so.13 it must
    # load it, find no cuInit, and say so, not crash.
    need(CUDART, "the CUDA 13 toolkit")
    p = probe({**NO_OVERRIDES, "HOSTREG_CUDA_LIBRARY": str(CUDART)})
    code, detail = p["probe"]["cuda"]
    assert code == 3 and "lacks the symbol cuInit" in detail, detail
    assert p["backend"] == "posix"


def test_doctor_json_has_every_backend_capability():
    rc, d = doctor(NO_OVERRIDES)
    assert rc == 0
    for b in d["backends"]:
        assert set(b) >= {"library", "version", "flags", "granule", "max_registration", "note"}, b
    posix = next(b for b in d["backends"] if b["name"] == "posix")
    assert posix["flags"] == 0xB and "mlock" in posix["note"]
    json.dumps(d)
