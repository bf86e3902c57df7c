"""bench/save_bench.py's measurements: every writer's saves and both readers' loads of one state
dict, and fio's O_DIRECT ceilings for its bytes. Imported by save_bench.py (run that)."""

from __future__ import annotations

import dataclasses
import gc
import os
import shutil
import time
from typing import Any

import torch.distributed.checkpoint as dcp
from common import MiB, state_bytes
from rich.console import Console
from save_parts import (
    LOAD_FROM,
    READERS,
    WRITERS,
    Host,
    Ranks,
    one_save,
    resident_bytes,
    tensors_of,
    verify,
)

import hostreg
import hostreg.torch as ht
from hostreg.cli.ceiling import fio


def measure_saves(
    sd: Any, dest: Any, reps: int, root: str, host: Host, ranks: Ranks, console: Console
) -> tuple[dict[str, list[dict[str, float]]], dict[str, Any], set[str]]:
    """Every writer's saves and both readers' loads of ``sd`` (loaded into ``dest``, compared
    with ``sd``); returns (samples, I/O stats of the last run, notes)."""
    notes: set[str] = set()
    samples: dict[str, list[dict[str, float]]] = {}
    extra: dict[str, Any] = {}
    nbytes = ranks.total(state_bytes(sd))  # page-cache growth is machine-wide: against every rank's bytes
    src, out = tensors_of(sd), tensors_of(dest)

    def add(key: str, **vals: float) -> None:
        samples.setdefault(key, []).append(vals)

    def fresh(d: str) -> None:  # a directory none of the ranks has written yet
        ranks.barrier()
        if ranks.root:
            shutil.rmtree(d, ignore_errors=True)
            host.drop_caches()
        ranks.barrier()

    stager = ht.Stager(async_staging=True)
    try:
        for _name, make in WRITERS:  # warm-up: the arena is made by the first; each writer once
            d = os.path.join(root, "warmup")
            fresh(d)
            one_save(sd, stager, d, make(d), ranks.pg)
            gc.collect()
        fresh(os.path.join(root, "warmup"))
        regs = hostreg.stats().registrations
        if ranks.root:
            console.print(f"  warm-up saves done ({regs} staging arena(s) registered)")

        for rep in range(reps):
            order = WRITERS[rep % len(WRITERS) :] + WRITERS[: rep % len(WRITERS)]  # a different first each rep
            for name, make in order:
                d = os.path.join(root, f"ckpt-{rep}")
                fresh(d)
                writer = make(d)
                before = host.meminfo()
                regs_before = hostreg.stats().registrations
                staged, done = one_save(sd, stager, d, writer, ranks.pg)
                ranks.barrier()
                after = host.meminfo()
                resident = resident_bytes(d) if ranks.root else None
                if hostreg.stats().registrations != regs_before:
                    notes.add("a timed save made a new staging arena (the previous one was still busy)")
                grow = (after["Cached"] + after["Dirty"]) - (before["Cached"] + before["Dirty"])
                shm = after.get("Shmem", 0) - before.get("Shmem", 0)
                if abs(shm) > 0.05 * nbytes:
                    notes.add(f"Shmem changed by {shm / MiB:.0f} MiB during a save (counted in Cached)")
                add(
                    name,
                    s=done,
                    staged=staged,
                    cache=100.0 * grow / nbytes,
                    resident=float("nan") if resident is None else 100.0 * resident / nbytes,
                )
                st = getattr(writer, "stats", None)
                if st is not None:
                    extra[name] = dataclasses.asdict(st)
                gc.collect()
                if name in LOAD_FROM:
                    readers = READERS if rep % 2 == 0 else READERS[::-1]
                    for reader in readers:
                        for x in out:
                            x.zero_()
                        ranks.barrier()
                        if ranks.root:
                            host.drop_caches()
                        ranks.barrier()
                        before = host.meminfo()
                        t0 = time.perf_counter()
                        if reader == READERS[0]:
                            dcp.load(dest, checkpoint_id=d, process_group=ranks.pg)
                        else:
                            r = ht.FileSystemReader(d)
                            dcp.load(dest, storage_reader=r, process_group=ranks.pg)
                            extra[f"{LOAD_FROM[name]}|{reader}"] = dataclasses.asdict(r.stats)
                        t = time.perf_counter() - t0
                        after = host.meminfo()
                        verify(src, out, f"{reader} of the checkpoint of {name}")
                        grow = (after["Cached"] + after["Dirty"]) - (before["Cached"] + before["Dirty"])
                        add(f"{LOAD_FROM[name]}|{reader}", s=t, cache=100.0 * grow / nbytes)
            if ranks.root:
                console.print(f"  repetition {rep + 1}/{reps} done")
        fresh(os.path.join(root, f"ckpt-{reps - 1}"))
    finally:
        stager.close()
        gc.collect()
    return samples, extra, notes


def ceilings(nbytes: int, reps: int, root: str, host: Host, engines: list[str]) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {}
    for _ in range(reps):
        f = os.path.join(root, "fio.tmp")
        try:
            host.drop_caches()
            out.setdefault("ceiling write", []).append({"s": nbytes / fio(f, nbytes, "write", engines)})
            host.drop_caches()
            out.setdefault("ceiling read", []).append({"s": nbytes / fio(f, nbytes, "read", engines)})
        finally:
            if os.path.exists(f):
                os.unlink(f)
    return out


def idle_note(host: Host, nbytes: int) -> str:
    """The noise floor of "page cache +%": Cached + Dirty growth over an idle second after drop_caches."""
    host.drop_caches()
    before = host.meminfo()
    time.sleep(1.0)
    after = host.meminfo()
    idle = (after["Cached"] + after["Dirty"]) - (before["Cached"] + before["Dirty"])
    return (
        f"Cached + Dirty grew by {round(idle / MiB) + 0} MiB ({round(100.0 * idle / nbytes, 1) + 0.0:.1f}% of the bytes) "
        "over an idle second after drop_caches (other processes, library pages read back): the noise in page cache +%."
    )
