"""The filesystem's own sequential bandwidth with ``O_DIRECT``: the ceiling a checkpoint's save
and load are read against (``hostreg stage --save``, ``bench/save_bench.py``).

With ``fio`` on ``PATH`` (Debian's ``fio`` package) it measures with fio: ``O_DIRECT``, 16 MiB
requests, ``iodepth=4``, io_uring (psync where io_uring is refused), ``end_fsync`` for the
write. Without it, a probe of its own does the same sequence with 4 threads of
``os.pwrite`` / ``os.preadv`` from one page-aligned buffer, then ``fdatasync``. Either way
the file is written in the given directory and removed afterwards, also when interrupted.
"""

from __future__ import annotations

import concurrent.futures
import json
import mmap
import os
import secrets
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

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


def fio(path: str, nbytes: int, rw: str, engines: list[str]) -> float:
    """O_DIRECT sequential bandwidth (bytes/s) of ``rw`` ("write" or "read") over ``path``
    with fio; moves an engine that fails to the back of ``engines`` (io_uring first, psync
    after). Raises RuntimeError with fio's words when every engine fails."""
    bs = max(_BLOCK, min(16 * MiB, nbytes // _BLOCK * _BLOCK))
    errors = []
    for engine in list(engines):
        cmd = ["fio", "--name=ceiling", f"--rw={rw}", f"--bs={bs}", f"--size={max(nbytes, bs)}", "--direct=1",
               f"--ioengine={engine}", "--iodepth=4", "--numjobs=1", "--end_fsync=1", f"--filename={path}",
               "--output-format=json"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        try:
            job = json.loads(p.stdout[p.stdout.index("{"):])["jobs"][0]
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


def _probe(path: str, nbytes: int) -> tuple[float, float, bool]:
    """(write, read bytes/s, O_DIRECT taken) by 4 threads of pwrite / preadv in 16 MiB pieces."""
    chunk = min(16 * MiB, max(_BLOCK, -(-nbytes // _BLOCK) * _BLOCK))
    pieces = list(range(0, nbytes, chunk))
    local = threading.local()
    buffers: list[mmap.mmap] = []  # page-aligned, as O_DIRECT needs; one per thread

    def own() -> mmap.mmap:
        if not hasattr(local, "buf"):
            local.buf = mmap.mmap(-1, chunk)
            local.buf.write(secrets.token_bytes(1 << 16) * (chunk >> 16) if chunk >= 1 << 16 else secrets.token_bytes(chunk))
            buffers.append(local.buf)
        return local.buf

    def started(pool: concurrent.futures.ThreadPoolExecutor) -> concurrent.futures.ThreadPoolExecutor:
        barrier = threading.Barrier(_THREADS)  # every thread up, its buffer made, before the clock starts
        list(pool.map(lambda _: barrier.wait(), range(_THREADS)))
        return pool

    try:
        direct = True
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            if e.errno != 22:  # EINVAL: no O_DIRECT on this filesystem
                raise
            direct = False
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with started(concurrent.futures.ThreadPoolExecutor(_THREADS, initializer=own)) as pool:
                t0 = time.perf_counter()
                list(pool.map(lambda off: os.pwrite(fd, own(), off), pieces))  # whole blocks; cut back below
                os.fdatasync(fd)
                write = nbytes / (time.perf_counter() - t0)
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | (os.O_DIRECT if direct else 0))
        try:
            with started(concurrent.futures.ThreadPoolExecutor(_THREADS, initializer=own)) as pool:
                t0 = time.perf_counter()
                list(pool.map(lambda off: os.preadv(fd, [own()], off), pieces))
                read = nbytes / (time.perf_counter() - t0)
        finally:
            os.close(fd)
        return write, read, direct
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
