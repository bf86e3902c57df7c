"""Shared fixtures. Every test must leave no registration and no locked memory behind:
the autouse fixture checks it after each test, with the kernel's own count (VmLck)."""

from __future__ import annotations

import ctypes
import gc
import mmap
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import hostreg

PAGE = mmap.PAGESIZE
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # tests/support: what the Python suite shares with scripts/gpu_check
# The Pythons the tests start, where they inherit this environment, freeze what importing torch
# made (tests/support/children/sitecustomize.py says why: it is most of their exit's cost).
CHILD_SITE = str(REPO / "tests" / "support" / "children")
if CHILD_SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # once, though xdist's workers inherit it
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (CHILD_SITE, os.environ.get("PYTHONPATH")) if p)


class Buffer:
    """An anonymous private mapping with its address, for registering by hand."""

    def __init__(self, nbytes: int) -> None:
        self.map = mmap.mmap(-1, nbytes)
        self.nbytes = nbytes
        self._view = ctypes.c_char.from_buffer(self.map)
        self.addr = ctypes.addressof(self._view)

    def close(self) -> None:
        del self._view
        self.map.close()


@pytest.fixture
def buf() -> Iterator[Buffer]:
    b = Buffer(64 * PAGE)
    yield b
    b.close()


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Iterator[None]:
    gc.collect()
    # What survives the collection is live: freezing it (gc.freeze) leaves the collection after
    # the test only the objects made since, not the ~260,000 of torch and pytest (150 ms each
    # time, twice per test). Nothing frozen here holds a registration: the check below passed
    # for every earlier test.
    gc.freeze()
    regs, locked = hostreg.stats().registrations, hostreg.locked_bytes()
    yield
    torch_save_threads_joined()
    gc.collect()
    assert hostreg.stats().registrations == regs, f"test left registrations behind: {hostreg.registrations()}"
    assert hostreg.locked_bytes() == locked, "test left memory locked (VmLck)"


def torch_save_threads_joined(timeout: float = 60) -> None:
    """Wait for the threads of DCP's thread-based async save to end. Each save's thread sets the
    future's result and only then drops the work item, which holds the staged state dict: a
    check of what is left right after ``result()`` could otherwise see that dict still alive."""
    for t in threading.enumerate():
        if t.name.startswith("AsyncCheckpointExecutor") and t is not threading.current_thread():
            t.join(timeout)


def run_python(
    code: str, *prefix: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter (optionally under a wrapper command such as prlimit)."""
    return subprocess.run(
        [*prefix, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


# Drop CAP_IPC_LOCK for the child (as root, effective capabilities come from the bounding
# set at exec) and set RLIMIT_MEMLOCK to 8192 KiB, the default of containers.
def low_memlock(kib: int = 8192) -> tuple[str, ...]:
    return ("prlimit", f"--memlock={kib * 1024}:{kib * 1024}", "setpriv", "--bounding-set=-ipc_lock", "--")


def table_row(out: str, name: str) -> str:
    """The value of row `name` in a table printed by the hostreg CLI (rich box drawing)."""
    m = re.search(rf"{re.escape(name)}\s*│\s*(.*?)\s*│", out)
    assert m, f"no row {name!r} in:\n{out}"
    return m.group(1)
