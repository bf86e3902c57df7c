"""Checkpoint I/O benchmark: hostreg's FileSystemWriter and FileSystemReader against DCP's own
and against the filesystem's O_DIRECT ceiling, end to end through ``dcp.async_save`` and
``dcp.load``.

Run (after scripts/setup):  .venv/bin/python bench/save_bench.py [--quick] [--reps N] [--dir D]

State dicts (one process, no process group; dcp_bench's builders, filled with random fp32):
  8 tensors       2 GiB in 8 fp32 tensors (under one "model" key)
  8192 tensors    2 GiB in 8,192 fp32 tensors
(--quick: 256 MiB each; --size-mib overrides). dcp_bench's FSDP2 GPT-2-medium + AdamW case
(2 gloo ranks) is not run here: it measures staging, this measures the storage layer.

Per state dict, in one run:
  ceilings  fio, O_DIRECT, 16 MiB requests, iodepth 4 (io_uring, else psync), end_fsync:
            sequential write of the same bytes in the target directory, then sequential read
            of that file; seconds = bytes / bandwidth
  saves     dcp.async_save(sd, checkpoint_id=d, storage_writer=W,
            async_stager=hostreg.torch.Stager(async_staging=True)), thread checkpointer, timed
            from the call until upload_completion.result() returns ("done"; "staged" until
            staging_completion), for W = DCP's FileSystemWriter(thread_count=1) (its default),
            (thread_count=2), and hostreg's FileSystemWriter (default thread_count=4; 1, 2, 8
            as extra rows), and a StorageWriter that stores nothing: DCP's own work (planning,
            staging, resolve_data, the metadata pickled), the floor under every save; "storage s"
            is a writer's done time above that floor. One Stager per state dict for every
            writer; each writer saves once untimed first, so every timed save is warm (the
            arena exists). Page-cache growth:
            Cached + Dirty of /proc/meminfo right before (after sync + drop_caches) and right
            after the save, as a percentage of the bytes saved; also the checkpoint files' own
            pages in the page cache right after (fincore), which library pages read back after
            drop_caches do not move (an idle second's Cached growth is in the caption).
  loads     from the checkpoint of hostreg's default writer and of DCP's thread_count=1 writer:
            stock dcp.load(dest, checkpoint_id=d) against dcp.load(dest,
            storage_reader=hostreg.torch.FileSystemReader(d)), into one preallocated destination
            (zeroed before each load, untimed), page cache dropped first; every tensor is
            compared bit-exactly with the source after each load (a mismatch raises).
Each measurement is repeated --reps times (default 3; --quick: 1); the table has medians.
Targets (the checkpoint I/O issue): hostreg's save done <= 1.15x the write ceiling and
<= 0.5x DCP's default writer (thread_count=1); hostreg's load >= 1.5x faster than stock
dcp.load; page-cache growth during hostreg's save <= 5%.
Not a test: it prints tables; read the ratios (the machine may be shared and noisy).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch.distributed.checkpoint import state_dict_saver  # noqa: E402
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult  # noqa: E402
from torch.futures import Future  # noqa: E402

import hostreg  # noqa: E402
import hostreg.torch as ht  # noqa: E402
from dcp_bench import MiB, plain_state_dict, state_bytes  # noqa: E402
from hostreg._ceiling import fio  # noqa: E402

class NoStorage(StorageWriter):
    """A DCP StorageWriter that stores nothing: what dcp.async_save costs on its own (planning,
    staging, resolve_data of every item, the metadata pickled in memory), the floor under every
    writer's "done" time. Its directory is left empty and is never loaded."""

    def __init__(self, path: str) -> None:
        super().__init__()
        os.makedirs(path, exist_ok=True)

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: Any) -> Any:
        return plan

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        return plans

    def write_data(self, plan: Any, planner: Any) -> Future:
        for item in plan.items:
            planner.resolve_data(item)
        fut: Future = Future()
        fut.set_result([WriteResult(index=i.index, size_in_bytes=0, storage_data=None) for i in plan.items])
        return fut

    def finish(self, metadata: Any, results: Any) -> None:
        pickle.dumps(metadata)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True


FLOOR = "DCP's own work, nothing stored"
DCP1 = "DCP writer tc=1 (default)"
DCP2 = "DCP writer tc=2"
HR = "hostreg writer tc=4 (default)"
WRITERS: list[tuple[str, Callable[[str], Any]]] = [
    (FLOOR, NoStorage),
    (DCP1, lambda d: dcp.FileSystemWriter(d, thread_count=1)),
    (DCP2, lambda d: dcp.FileSystemWriter(d, thread_count=2)),
    (HR, lambda d: ht.FileSystemWriter(d)),
    ("hostreg writer tc=1", lambda d: ht.FileSystemWriter(d, thread_count=1)),
    ("hostreg writer tc=2", lambda d: ht.FileSystemWriter(d, thread_count=2)),
    ("hostreg writer tc=8", lambda d: ht.FileSystemWriter(d, thread_count=8)),
]
LOAD_FROM = {HR: "hostreg's", DCP1: "DCP tc=1's"}  # checkpoints that are also loaded, and their short names
READERS = ["stock dcp.load", "hostreg reader"]


# ---- the machine -------------------------------------------------------------------------------


class Host:
    """Page-cache dropping and /proc/meminfo; remembers whether dropping ever failed."""

    def __init__(self) -> None:
        self.drop_failed: str | None = None

    def drop_caches(self) -> None:
        os.sync()
        if self.drop_failed:
            return
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1")
        except OSError as e:
            self.drop_failed = e.strerror or str(e)

    @staticmethod
    def meminfo() -> dict[str, int]:
        out = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                out[key] = int(rest.split()[0]) * 1024  # kB
        return out


def resident_bytes(directory: str) -> int | None:
    """Bytes of the files in ``directory`` that are in the page cache (fincore: mincore), or None
    without fincore. Unlike Cached, not moved by library pages read back after drop_caches."""
    files = [os.path.join(directory, f) for f in sorted(os.listdir(directory))]
    try:
        p = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *files],
                           capture_output=True, text=True)
    except OSError:
        return None
    if p.returncode != 0:
        return None
    return sum(int(x) for x in p.stdout.split())


# ---- state dicts -------------------------------------------------------------------------------


def random_state_dict(count: int, total: int, seed: int) -> dict[str, Any]:
    """dcp_bench's ``{"model": {count fp32 tensors}}`` of ``total`` bytes, refilled with uniform
    random values (each tensor its own, from one seeded generator: equality checks mean
    something; torch.randn would take minutes for 2 GiB on 2 cores)."""
    sd = plain_state_dict(count, total // count)
    gen = torch.Generator().manual_seed(seed)
    for t in sd["model"].values():
        t.uniform_(-1.0, 1.0, generator=gen)
    return sd


def zeros_like_sd(sd: dict[str, Any]) -> dict[str, Any]:
    dest = {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()}}
    for t in dest["model"].values():  # the memory touched: a page fault is not part of a load
        t.fill_(1.0)
        t.zero_()
    return dest


def verify(src: dict[str, Any], dest: dict[str, Any], what: str) -> None:
    bad = [k for k, v in src["model"].items() if not torch.equal(v, dest["model"][k])]
    if bad:
        raise RuntimeError(f"{what}: {len(bad)} of {len(src['model'])} tensors differ from the source "
                           f"after the load (first: {bad[:5]})")


# ---- one case ----------------------------------------------------------------------------------


def one_save(sd: dict[str, Any], stager: Any, path: str, writer: Any) -> tuple[float, float]:
    t0 = time.perf_counter()
    res = dcp.async_save(sd, checkpoint_id=path, storage_writer=writer, async_stager=stager)
    if not isinstance(res, state_dict_saver.AsyncSaveResponse):
        raise RuntimeError(f"dcp.async_save returned {type(res).__name__}, not an AsyncSaveResponse: "
                           "this torch does not take a staging future")
    res.staging_completion.result()
    staged = time.perf_counter() - t0
    res.upload_completion.result()
    done = time.perf_counter() - t0
    del res
    return staged, done


def run_case(count: int, total: int, reps: int, root: str, host: Host, engines: list[str],
             console: Console) -> dict[str, Any]:
    notes: set[str] = set()
    samples: dict[str, list[dict[str, float]]] = {}
    extra: dict[str, Any] = {}

    def add(key: str, **vals: float) -> None:
        samples.setdefault(key, []).append(vals)

    t = time.perf_counter()
    sd = random_state_dict(count, total, seed=count)
    nbytes = state_bytes(sd)
    dest = zeros_like_sd(sd)
    console.print(f"  state dict and destination made ({nbytes / MiB:.0f} MiB each, {time.perf_counter() - t:.1f} s)")

    # Ceilings.
    for rep in range(reps):
        f = os.path.join(root, "fio.tmp")
        try:
            host.drop_caches()
            add("ceiling write", s=nbytes / fio(f, nbytes, "write", engines))
            host.drop_caches()
            add("ceiling read", s=nbytes / fio(f, nbytes, "read", engines))
        finally:
            if os.path.exists(f):
                os.unlink(f)
    console.print(f"  ceilings measured (fio, {engines[0]})")

    stager = ht.Stager(async_staging=True)
    try:
        for name, make in WRITERS:  # warm-up: the arena is made by the first; each writer once
            d = os.path.join(root, "warmup")
            one_save(sd, stager, d, make(d))
            shutil.rmtree(d)
            gc.collect()
        regs = hostreg.stats().registrations
        console.print(f"  warm-up saves done ({regs} staging arena(s) registered)")

        for rep in range(reps):
            order = WRITERS[rep % len(WRITERS):] + WRITERS[:rep % len(WRITERS)]  # a different first each rep
            for name, make in order:
                d = os.path.join(root, f"ckpt-{rep}")
                writer = make(d)
                host.drop_caches()
                before = host.meminfo()
                regs_before = hostreg.stats().registrations
                staged, done = one_save(sd, stager, d, writer)
                after = host.meminfo()
                resident = resident_bytes(d)
                if hostreg.stats().registrations != regs_before:
                    notes.add("a timed save made a new staging arena (the previous one was still busy)")
                grow = (after["Cached"] + after["Dirty"]) - (before["Cached"] + before["Dirty"])
                shm = after.get("Shmem", 0) - before.get("Shmem", 0)
                if abs(shm) > 0.05 * nbytes:
                    notes.add(f"Shmem changed by {shm / MiB:.0f} MiB during a save (counted in Cached)")
                add(name, s=done, staged=staged, cache=100.0 * grow / nbytes,
                    resident=float("nan") if resident is None else 100.0 * resident / nbytes)
                st = getattr(writer, "stats", None)
                if st is not None:
                    extra[name] = st
                gc.collect()
                if name in LOAD_FROM:
                    readers = READERS if rep % 2 == 0 else READERS[::-1]
                    for reader in readers:
                        for x in dest["model"].values():
                            x.zero_()
                        host.drop_caches()
                        t0 = time.perf_counter()
                        if reader == READERS[0]:
                            dcp.load(dest, checkpoint_id=d)
                        else:
                            r = ht.FileSystemReader(d)
                            dcp.load(dest, storage_reader=r)
                            extra[f"{LOAD_FROM[name]}|{reader}"] = r.stats
                        s = time.perf_counter() - t0
                        verify(sd, dest, f"{reader} of the checkpoint of {name}")
                        add(f"{LOAD_FROM[name]}|{reader}", s=s)
                shutil.rmtree(d)
            console.print(f"  repetition {rep + 1}/{reps} done")
        # The noise floor of "page cache +%": Cached + Dirty growth over an idle second after drop_caches.
        host.drop_caches()
        before = host.meminfo()
        time.sleep(1.0)
        after = host.meminfo()
        idle = (after["Cached"] + after["Dirty"]) - (before["Cached"] + before["Dirty"])
        notes.add(f"Cached + Dirty grew by {round(idle / MiB) + 0} MiB ({round(100.0 * idle / nbytes, 1) + 0.0:.1f}% of the bytes) over an idle "
                  "second after drop_caches (other processes, library pages read back): the noise in page cache +%.")
    finally:
        stager.close()
        del sd, dest
        gc.collect()
    return {"bytes": nbytes, "count": count, "samples": samples, "stats": extra, "notes": sorted(notes)}


# ---- tables ------------------------------------------------------------------------------------


def med(res: dict[str, Any], key: str, field: str = "s") -> float:
    return statistics.median(s[field] for s in res["samples"][key])


def io_note(st: Any) -> str:
    if st is None:
        return ""
    moved = st.direct_bytes + st.bounced_bytes
    share = 100.0 * st.direct_bytes / moved if moved else 0.0
    s = f"{'O_DIRECT' if st.direct else 'buffered'}, {share:.0f}% zero-copy, {st.requests} requests"
    if st.copied_bytes:
        s += f", {st.copied_bytes / MiB:.0f} MiB copied"
    return s


def mark(ok: bool) -> str:
    return "[green]met[/green]" if ok else "[red]missed[/red]"


def case_table(title: str, res: dict[str, Any], caption: str) -> tuple[Table, int]:
    n = res["bytes"]
    wceil, rceil = med(res, "ceiling write"), med(res, "ceiling read")
    base = med(res, DCP1)
    table = Table(title=title, caption=caption, caption_justify="left")
    floor = med(res, FLOOR)
    cols = ["measurement", "staged s", "done s", "GB/s", "x ceiling", "x DCP tc=1", "storage s", "storage x ceiling",
            "page cache +%", "ckpt cached %", "speedup vs stock", "I/O (last run)", "targets"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("measurement", "I/O (last run)", "targets") else "right")
    table.add_row("fio O_DIRECT write ceiling", "", f"{wceil:.3f}", f"{n / wceil / 1e9:.2f}", "1.00", *[""] * 8)
    table.add_row("fio O_DIRECT read ceiling", "", f"{rceil:.3f}", f"{n / rceil / 1e9:.2f}", "1.00", *[""] * 8)
    table.add_section()
    misses = 0
    for name, _ in WRITERS:
        s, staged, cache = med(res, name), med(res, name, "staged"), med(res, name, "cache")
        if name == FLOOR:
            table.add_row(f"save {name}", f"{staged:.3f}", f"{s:.3f}", "", f"{s / wceil:.2f}", f"{s / base:.2f}",
                          *[""] * 7)
            continue
        resident = med(res, name, "resident")
        targets = ""
        if name.startswith("hostreg"):
            checks = [("ceiling", s / wceil <= 1.15), ("DCP", s / base <= 0.5), ("cache", cache <= 5.0)]
            targets = " ".join(f"{what} {mark(ok)}" for what, ok in checks)
            if name == HR:
                misses += sum(not ok for _, ok in checks)
        table.add_row(f"save {name}", f"{staged:.3f}", f"{s:.3f}", f"{n / s / 1e9:.2f}", f"{s / wceil:.2f}",
                      f"{s / base:.2f}", f"{s - floor:.3f}", f"{(s - floor) / wceil:.2f}", f"{round(cache, 1) + 0.0:.1f}",
                      f"{resident:.1f}", "", io_note(res["stats"].get(name)), targets)
    table.add_section()
    for short in LOAD_FROM.values():
        stock = med(res, f"{short}|{READERS[0]}")
        for reader in READERS:
            key = f"{short}|{reader}"
            s = med(res, key)
            targets = ""
            if reader != READERS[0]:
                ok = stock / s >= 1.5
                targets = f"speedup {mark(ok)}"
                misses += not ok
            table.add_row(f"load {short} ckpt: {reader}", "", f"{s:.3f}", f"{n / s / 1e9:.2f}",
                          f"{s / rceil:.2f}", "", "", "", "", "", f"{stock / s:.2f}", io_note(res["stats"].get(key)), targets)
    return table, misses


def main() -> int:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="256 MiB state dicts and --reps 1, for a smoke run")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per measurement (median; default 3, --quick 1)")
    ap.add_argument("--size-mib", type=int, default=None, help="bytes of each state dict in MiB (default 2048, --quick 256)")
    ap.add_argument("--dir", default=None, help="where checkpoints are written (default: a temporary directory in /tmp)")
    ap.add_argument("--cases", default="8,8192", help="tensor counts, comma-separated (default: 8,8192)")
    ap.add_argument("--json", default=None, help="also write every sample here")
    args = ap.parse_args()
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    if reps < 1:
        ap.error("--reps must be >= 1")
    size = (args.size_mib if args.size_mib is not None else (256 if args.quick else 2048)) * MiB
    try:
        counts = [int(c) for c in args.cases.split(",")]
    except ValueError:
        ap.error(f"--cases: not a list of tensor counts: {args.cases}")
    for c in counts:
        if c < 1 or size % (4 * c):
            ap.error(f"--cases: {size} bytes do not split into {c} fp32 tensors")

    console = Console(width=max(Console().width, 240))
    parent = args.dir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    root = tempfile.mkdtemp(prefix="save_bench-", dir=parent)
    host, engines = Host(), ["io_uring", "psync"]
    console.print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; checkpoints in {root}; median of {reps}")
    results = {}
    try:
        for count in counts:
            title = f"{size // MiB} MiB in {count:,} tensors"
            console.print(f"running {title} ...")
            results[title] = run_case(count, size, reps, root, host, engines, console)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    misses = 0
    for title, res in results.items():
        caption = [
            f"Median of {reps}; seconds; GB = 1e9 bytes. Save: dcp.async_save through one hostreg Stager(async_staging=True), "
            "thread checkpointer, warm; \"done\" = until upload_completion.result().",
            f"Ceilings: fio O_DIRECT, 16 MiB requests, iodepth 4, {engines[0]}, end_fsync; loads' \"x ceiling\" is against the read ceiling.",
            "Page cache +%: growth of Cached + Dirty (/proc/meminfo) over the save, % of the bytes saved (it also counts library "
            "pages read back after drop_caches); ckpt cached %: the checkpoint's own files in the page cache right after the "
            "save (fincore), not judged.",
            "Targets: hostreg save done <= 1.15x the write ceiling (\"ceiling\") and <= 0.5x DCP's default writer, "
            "thread_count=1 (\"DCP\"); page-cache growth <= 5% (\"cache\"); hostreg load >= 1.5x faster than stock "
            "dcp.load of the same checkpoint (\"speedup\").",
            f"{FLOOR!r}: a StorageWriter that stores nothing (planning, staging, resolve_data, the metadata pickled), the "
            "floor under every save through dcp.async_save; storage s = done s - that floor: the writer's own share.",
            "Every load compared bit-exactly with the source: all equal.",
        ]
        if host.drop_failed:
            caption.append(f"page cache not dropped ({host.drop_failed})")
        caption += res["notes"]
        table, m = case_table(f"{title} ({res['bytes'] / MiB / 1024:.2f} GiB)", res, "\n".join(caption))
        misses += m
        console.print(table)
    console.print(f"targets missed (hostreg's default writer and its reader): {misses}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({t: {k: v for k, v in r.items() if k != "stats"} for t, r in results.items()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
