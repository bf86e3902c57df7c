"""Diagnostics: the ``hostreg`` Python logger and HOSTREG_LOG_LEVEL on the C++ side; silent
by default."""

from __future__ import annotations

import logging

from conftest import Buffer, low_memlock, run_python

import hostreg

FAILING = "import mmap, ctypes, hostreg; m = mmap.mmap(-1, 8192); a = ctypes.addressof(ctypes.c_char.from_buffer(m)); hostreg.host_register(a, 100); hostreg.host_register(a, 100); hostreg.host_unregister(a + 1); hostreg.host_unregister(a)"


def test_silent_by_default():
    r = run_python(FAILING, env={"HOSTREG_LOG_LEVEL": ""})
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""


def test_cpp_side_logs_to_stderr_at_debug():
    r = run_python(FAILING, env={"HOSTREG_LOG_LEVEL": "debug"})
    lines = r.stderr.splitlines()
    assert lines[0] == "hostreg info: backend posix selected"
    assert lines[1].startswith("hostreg debug: cudaErrorHostMemoryAlreadyRegistered (712), native 0: range")
    assert lines[2].startswith("hostreg debug: cudaErrorHostMemoryNotRegistered (713)")
    r = run_python(FAILING, env={"HOSTREG_LOG_LEVEL": "warning"})
    assert r.stderr == ""  # the caller's mistakes are not warnings


def test_python_logger_levels(caplog, buf: Buffer):
    caplog.set_level(logging.DEBUG, logger="hostreg")
    assert hostreg.host_register(buf.addr, 100) == 0
    assert hostreg.host_register(buf.addr, 100) == 712
    assert hostreg.host_unregister(buf.addr) == 0
    failures = [r for r in caplog.records if r.name == "hostreg" and "cudaHostRegister" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.DEBUG]
    assert "cudaErrorHostMemoryAlreadyRegistered (712), native 0" in failures[0].getMessage()


def test_environment_failures_are_warnings_with_native_code():
    code = "import logging; logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s %(message)s'); " + FAILING.replace(
        "hostreg.host_register(a, 100); hostreg.host_register(a, 100)", "m2 = mmap.mmap(-1, 64 << 20); b = ctypes.addressof(ctypes.c_char.from_buffer(m2)); hostreg.host_register(b, 64 << 20)"
    )
    r = run_python(code, *low_memlock(8192), env={"HOSTREG_LOG_LEVEL": ""})
    assert r.returncode == 0
    assert r.stderr.startswith("WARNING hostreg cudaHostRegister: cudaErrorMemoryAllocation (2), native 12: mlock(")
    assert "RLIMIT_MEMLOCK" in r.stderr and "713" not in r.stderr  # the unregister slip is DEBUG only
