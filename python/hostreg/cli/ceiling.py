"""The filesystem's own sequential bandwidth with ``O_DIRECT``: the ceiling a checkpoint's save
and load are read against (``hostreg stage --save``, ``bench/save_bench.py``).

With ``fio`` on ``PATH`` (Debian's ``fio`` package) it measures with fio: ``O_DIRECT``, 16 MiB
requests, ``iodepth=4``, io_uring (psync where io_uring is refused), ``end_fsync`` for the
write. Without it, a probe of its own does the same sequence with 4 threads of
``os.pwrite`` / ``os.preadv`` from one page-aligned buffer, then ``fdatasync``. Either way
the file is written in the given directory and removed afterwards, also when interrupted.
"""

from __future__ import annotations

import json
import mmap
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Any

MiB = 1 << 20
_BLOCK = 4096
_THREADS = 4


@dataclass
class Ceiling:
    """Sequential bandwidth of one directory's filesystem, bytes per second."""

    write: float
    read: float
    tool: str  #: how it was measured, e.g. "fio io_uring, O_DIRECT, 16 MiB requests, iodepth 4"
    direct: bool  #: False when the filesystem refused O_DIRECT (then it is the page cache's speed)


def _run_group(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` (fio, with ``--thread``: its jobs are threads of its one process, so that
    the process's end is theirs) and returns its output; an exception or an interrupt on the
    caller stops it and waits until it is gone before re-raising: fio is asked to stop
    (SIGTERM: it ends its jobs) and killed only if it has not within 10 s. (Without
    ``--thread`` each job is a process of its own session, which could outlive fio's main
    process by the length of a large O_DIRECT write.)"""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate()
    except BaseException:
        proc.terminate()
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def fio(path: str, nbytes: int, rw: str, engines: list[str]) -> float:
    """O_DIRECT sequential bandwidth (bytes/s) of ``rw`` ("write" or "read") over ``path``
    with fio; moves an engine that fails to the back of ``engines`` (io_uring first, psync
    after). Raises RuntimeError with fio's words when every engine fails."""
    bs = max(_BLOCK, min(16 * MiB, nbytes // _BLOCK * _BLOCK))
    errors = []
    for engine in list(engines):
        cmd = [
            "fio",
            "--name=ceiling",
            f"--rw={rw}",
            f"--bs={bs}",
            f"--size={max(nbytes, bs)}",
            "--direct=1",
            f"--ioengine={engine}",
            "--iodepth=4",
            "--numjobs=1",
            "--thread",
            "--end_fsync=1",
            f"--filename={path}",
            "--output-format=json",
        ]
        p = _run_group(cmd)
        try:
            job = json.loads(p.stdout[p.stdout.index("{") :])["jobs"][0]
            ok = p.returncode == 0 and job["error"] == 0 and job[rw]["bw_bytes"] > 0
        except (ValueError, KeyError, IndexError):
            ok = False
        if ok:
            if engine != engines[0]:
                engines.remove(engine)
                engines.insert(0, engine)
            return float(job[rw]["bw_bytes"])
        errors.append(f"{engine}: rc {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}")
    raise RuntimeError("fio failed with every engine:\n" + "\n".join(errors))


def _run_threads(work: Any, count: int) -> None:
    """Runs work(k, stop) on ``count`` threads at once and waits for them; an exception or an
    interrupt (Ctrl-C) on the caller sets ``stop`` (each thread ends after its current piece),
    waits for them all, and re-raises: nothing is left running. A thread's own failure is
    re-raised here."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def body(k: int) -> None:
        try:
            work(k, stop)
        except BaseException as e:  # noqa: BLE001 -- handed to the caller
            errors.append(e)
            stop.set()

    threads = [threading.Thread(target=body, args=(k,), daemon=True, name=f"hostreg-ceiling-{k}") for k in range(count)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.1)  # in slices, so that Ctrl-C reaches this thread
    except BaseException:
        stop.set()
        for t in threads:
            if t.ident is not None:
                t.join()
        raise
    if errors:
        raise errors[0]


def _probe(path: str, nbytes: int) -> tuple[float, float, bool]:
    """(write, read bytes/s, O_DIRECT taken) by 4 threads of pwrite / preadv in 16 MiB pieces
    (thread k takes pieces k, k + 4, ...), each from a page-aligned buffer of its own made
    before the clock starts."""
    chunk = min(16 * MiB, max(_BLOCK, -(-nbytes // _BLOCK) * _BLOCK))
    pieces = list(range(0, nbytes, chunk))
    pattern = secrets.token_bytes(1 << 16)
    buffers = [mmap.mmap(-1, chunk) for _ in range(_THREADS)]  # page-aligned, as O_DIRECT needs
    try:
        for b in buffers:
            b.write(pattern * (chunk // len(pattern)) if chunk >= len(pattern) else pattern[:chunk])
        direct = True
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno != 22:  # EINVAL: no O_DIRECT on this filesystem
                raise
            direct = False
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:

            def write(k: int, stop: threading.Event) -> None:
                for off in pieces[k::_THREADS]:
                    if stop.is_set():
                        return
                    os.pwrite(fd, buffers[k], off)  # whole blocks; cut back below

            t0 = time.perf_counter()
            _run_threads(write, _THREADS)
            os.fdatasync(fd)
            write_bps = nbytes / (time.perf_counter() - t0)
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if direct else 0))
        try:

            def read(k: int, stop: threading.Event) -> None:
                for off in pieces[k::_THREADS]:
                    if stop.is_set():
                        return
                    os.preadv(fd, [buffers[k]], off)

            t0 = time.perf_counter()
            _run_threads(read, _THREADS)
            read_bps = nbytes / (time.perf_counter() - t0)
        finally:
            os.close(fd)
        return write_bps, read_bps, direct
    finally:
        for b in buffers:
            b.close()


def measure(directory: str | os.PathLike, nbytes: int) -> Ceiling:
    """The ceiling for ``nbytes`` (> 0) in ``directory``: a sequential write then a
    sequential read of a temporary file there, removed afterwards. Raises OSError (ENOSPC,
    EACCES) when the directory cannot take the file."""
    if nbytes <= 0:
        raise ValueError(f"nbytes must be > 0, got {nbytes}")
    path = os.path.join(os.fspath(directory), f".hostreg-ceiling-{secrets.token_hex(4)}")
    try:
        if shutil.which("fio"):
            engines = ["io_uring", "psync"]
            w = fio(path, nbytes, "write", engines)
            r = fio(path, nbytes, "read", engines)
            return Ceiling(w, r, f"fio {engines[0]}, O_DIRECT, 16 MiB requests, iodepth 4", True)
        w, r, direct = _probe(path, nbytes)
        how = "O_DIRECT" if direct else "buffered (no O_DIRECT here)"
        return Ceiling(w, r, f"{_THREADS} threads of pwrite/preadv, {how}, 16 MiB requests (no fio on PATH)", direct)
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
