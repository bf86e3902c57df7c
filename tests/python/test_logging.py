"""Diagnostics: the C core's events reach the ``hostreg`` Python logger once each, and
HOSTREG_LOG_LEVEL prints them on stderr; silent by default."""

from __future__ import annotations

import logging
import sys

from conftest import Buffer, low_memlock, run_python

import hostreg

FAILING = "import mmap, ctypes, hostreg; m = mmap.mmap(-1, 8192); a = ctypes.addressof(ctypes.c_char.from_buffer(m)); hostreg.host_register(a, 100); hostreg.host_register(a, 100); hostreg.host_unregister(a + 1); hostreg.host_unregister(a)"


def test_silent_by_default():
    r = run_python(FAILING, env={"HOSTREG_LOG_LEVEL": ""})
    assert r.returncode == 0 and r.stderr == "" and r.stdout == ""


def test_log_level_prints_each_event_once_on_stderr():
    r = run_python(FAILING, env={"HOSTREG_LOG_LEVEL": "debug"})
    lines = r.stderr.splitlines()
    assert lines[0] == "hostreg info: backend posix selected"
    assert lines[1].startswith(
        "hostreg debug: hostregHostRegister: cudaErrorHostMemoryAlreadyRegistered (712), native 0: range"
    )
    assert lines[2].startswith("hostreg debug: hostregHostUnregister: cudaErrorHostMemoryNotRegistered (713)")
    assert len(lines) == 3
    r = run_python(FAILING, env={"HOSTREG_LOG_LEVEL": "warning"})
    assert r.stderr == ""  # the caller's mistakes are not warnings


def test_log_level_with_a_root_handler_still_prints_once():
    code = "import logging; logging.basicConfig(level=logging.DEBUG); " + FAILING
    r = run_python(code, env={"HOSTREG_LOG_LEVEL": "debug"})
    assert r.stderr.count("(712)") == 1 and r.stderr.count("(713)") == 1, r.stderr


def test_python_logger_levels(caplog, buf: Buffer):
    caplog.set_level(logging.DEBUG, logger="hostreg")
    assert hostreg.host_register(buf.addr, 100) == 0
    assert hostreg.host_register(buf.addr, 100) == 712
    assert hostreg.host_unregister(buf.addr) == 0
    failures = [r for r in caplog.records if r.name == "hostreg" and "hostregHostRegister" in r.getMessage()]
    assert [r.levelno for r in failures] == [logging.DEBUG]  # one line for one failure
    assert "cudaErrorHostMemoryAlreadyRegistered (712), native 0" in failures[0].getMessage()


def test_environment_failures_are_warnings_with_native_code():
    code = (
        "import logging; logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(name)s %(message)s'); "
        + FAILING.replace(
            "hostreg.host_register(a, 100); hostreg.host_register(a, 100)",
            "m2 = mmap.mmap(-1, 64 << 20); b = ctypes.addressof(ctypes.c_char.from_buffer(m2)); hostreg.host_register(b, 64 << 20)",
        )
    )
    r = run_python(code, *low_memlock(8192), env={"HOSTREG_LOG_LEVEL": ""})
    assert r.returncode == 0
    assert r.stderr.startswith("WARNING hostreg hostregHostRegister: cudaErrorMemoryAllocation (2), native 12: mlock(")
    assert "RLIMIT_MEMLOCK" in r.stderr and "713" not in r.stderr  # the unregister slip is DEBUG only


def test_a_logging_handler_that_raises_does_not_fail_the_call(caplog, buf: Buffer, monkeypatch):
    class Boom(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            raise RuntimeError("handler failed")

    hostreg.backend()  # chosen before the handler is in place: its INFO line is not one of the events counted
    unraisable: list = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    h = Boom(level=logging.DEBUG)
    logging.getLogger("hostreg").addHandler(h)
    try:
        caplog.set_level(logging.DEBUG, logger="hostreg")
        assert hostreg.host_unregister(buf.addr) == 713  # the call's answer, whatever the handler does
        assert hostreg.host_register(buf.addr, 100) == 0 and hostreg.host_unregister(buf.addr) == 0
    finally:
        logging.getLogger("hostreg").removeHandler(h)
    # The handler's failure is reported as an unraisable exception, not raised from the call.
    assert [type(u.exc_value) for u in unraisable] == [RuntimeError]


def test_a_ctrl_c_in_a_logging_handler_is_delivered_right_after_the_call():
    # The C core calls the handler in the middle of a hostreg call, where no exception can pass
    # through C: a KeyboardInterrupt there is delivered again (as SIGINT is) once the C call has
    # returned, so the Ctrl-C is not lost and the call itself completed.
    code = """
import logging, mmap, ctypes, hostreg
class CtrlC(logging.Handler):
    def emit(self, record):
        raise KeyboardInterrupt
log = logging.getLogger("hostreg"); log.addHandler(CtrlC()); log.setLevel(logging.DEBUG)
m = mmap.mmap(-1, 8192); a = ctypes.addressof(ctypes.c_char.from_buffer(m))
got = None
try:
    got = int(hostreg.host_unregister(a))
    for _ in range(1000):
        pass
    print("no interrupt")
except KeyboardInterrupt:
    print("interrupted after the call")
print(hostreg.stats().registrations, hostreg.last_error().code)
"""
    r = run_python(code, env={"HOSTREG_LOG_LEVEL": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["interrupted after the call", "0 cudaErrorHostMemoryNotRegistered (713)"]


def test_environment_mistakes_with_a_callers_code_are_warnings():
    # HOSTREG_SHM_DIR wrong is code 1 (as a bad argument is), but the environment's fault.
    code = "import logging; logging.basicConfig(level=logging.WARNING, format='%(levelname)s %(message)s'); from hostreg import _hostreg; print(_hostreg.shared_memory_directory()[0])"
    r = run_python(code, env={"HOSTREG_LOG_LEVEL": "", "HOSTREG_SHM_DIR": "relative/dir"})
    assert r.returncode == 0 and r.stdout.strip() == "1", r.stderr
    assert (
        r.stderr.startswith("WARNING hostregSharedMemoryDirectory: cudaErrorInvalidValue (1)")
        and "HOSTREG_SHM_DIR=relative/dir" in r.stderr
    )


def test_lookups_are_answers_not_events(caplog, buf: Buffer):
    hostreg.backend()  # the backend's selection, once per process, is an event (logged at INFO): done before
    caplog.set_level(logging.DEBUG, logger="hostreg")
    assert hostreg.registration(buf.addr) is None and hostreg.backend() == "posix"
    assert not [r for r in caplog.records if r.name == "hostreg"]


def test_a_message_that_is_not_utf8_still_reaches_the_logger():
    code = "import logging; logging.basicConfig(level=logging.INFO, format='%(levelname)s %(message)s'); import hostreg; print(hostreg.backend())"
    r = run_python(code, env={"HOSTREG_LOG_LEVEL": "", "HOSTREG_BACKEND": "bad\udcff"})  # the byte 0xff
    assert r.returncode == 0 and r.stdout.strip() == "none", r.stderr
    assert "INFO no backend: unknown backend 'bad\\xff'" in r.stderr and "Unicode" not in r.stderr


def test_a_slow_log_handler_and_a_second_thread_do_not_deadlock():
    # The handler gives up the GIL (sleep) while another thread calls into hostreg holding it.
    code = """
import logging, threading, time
from hostreg import _hostreg
class Slow(logging.Handler):
    def emit(self, record):
        time.sleep(0.2)
log = logging.getLogger("hostreg"); log.setLevel(logging.DEBUG); log.addHandler(Slow())
ts = [threading.Thread(target=_hostreg.shared_memory_directory) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print("done")
"""
    r = run_python(code, env={"HOSTREG_LOG_LEVEL": "", "HOSTREG_SHM_DIR": "relative"}, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "done", r.stderr


def test_an_unknown_log_level_is_said_not_silently_ignored():
    r = run_python("import hostreg; print(hostreg.backend())", env={"HOSTREG_LOG_LEVEL": "loud"})
    assert r.returncode == 0 and r.stdout.strip() == "posix"
    assert r.stderr == "hostreg: HOSTREG_LOG_LEVEL='loud' is not debug, info, warning, warn or off; ignored\n"


def test_a_handler_that_calls_hostreg_cannot_change_the_reported_cause():
    # The handler runs while the failure is being reported; its own hostreg call (a lookup of
    # an unregistered pointer: 713) must not become the cause the StagingError names.
    src = """
import logging, hostreg, hostreg.torch as ht, torch
class Meddling(logging.Handler):
    def emit(self, record):
        hostreg.host_unregister(4096)
        hostreg.registration(4096)
log = logging.getLogger("hostreg"); log.addHandler(Meddling()); log.setLevel(logging.DEBUG)
try:
    ht.create_cpu_state_dict({"w": torch.ones(1 << 20)})
except hostreg.StagingError as e:
    print(str(e).replace(chr(10), " "))
"""
    r = run_python(src, *low_memlock(64), env={"HOSTREG_BACKEND": "posix"})
    assert r.returncode == 0, r.stderr
    assert "RLIMIT_MEMLOCK" in r.stdout and "not registered" not in r.stdout, r.stdout
