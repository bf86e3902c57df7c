"""Item-count scaling: the same bytes as 1,024 to 262,144 tensors, saved and loaded by stock
DCP and by hostreg, against the disk's O_DIRECT ceiling, with where the time goes.

Run (after scripts/setup):  .venv/bin/python bench/items_bench.py [--quick] [--mib M] [--dir D]

One process, ``{"model": {N fp32 tensors}}`` of --mib MiB in all (default 256), for N = 1,024,
8,192, 65,536 and 262,144 (--quick: without 262,144; stock DCP is left out past 65,536, where a
save of it takes minutes). In one run, per N, in the same directory:

  ceiling     fio, O_DIRECT, 16 MiB requests, iodepth 4, end_fsync: write, then read, of the
              state dict's bytes (bench/save_measure.py's)
  stock       dcp.save(sd, checkpoint_id=d): DCP's planner and writer; first save, then a
              second ("repeated") into the same directory
  hostreg     dcp.save with hostreg.torch.SavePlanner and FileSystemWriter: first and repeated
  async       dcp.async_save with hostreg.torch.Stager(async_staging=True), SavePlanner and
              FileSystemWriter, timed to upload_completion ("done"); first, then the median of
              3 repeated saves after a warm-up
  loads       into a pinned destination (hostreg.torch.create_cpu_state_dict(pin_memory=True)),
              page cache dropped first: stock dcp.load, and dcp.load with hostreg's reader and
              hostreg.torch.LoadPlanner; then `hostreg verify`'s check of every byte
              (verify_checkpoint), and the load again with FileSystemReader(verify=True);
              every tensor compared with the source after each

Columns: seconds, the ratio to the ceiling's seconds ("x ceil", time over time), and the cost
per item in microseconds ((seconds - ceiling seconds) / N: what is paid per item above the
bytes). A second table gives hostreg's repeated save and its load by phase (wall seconds
spent in the planner's, writer's and reader's methods, from subclasses that time them).
Targets (the many-items issue): repeated async save <= 1.5x the ceiling at 8,192 items and
<= 2.0x at 65,536; first hostreg save <= 0.3x stock's (8,192 items and more); hostreg load <= 2x
the read ceiling and <= 0.33x stock's time (3x faster); the per-item cost of a repeated save outside
write_data flat from 8,192 to 262,144. A repeated save writes over the files of the one before
(their blocks already allocated), where fio writes a new file: on a virtual disk that can put
a save below the "ceiling". Not a test: it prints tables.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections import defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from common import MiB  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from save_measure import ceilings  # noqa: E402
from save_parts import Host, random_state_dict  # noqa: E402

import hostreg.torch as ht  # noqa: E402

PHASES: dict[str, float] = defaultdict(float)


def timed(cls: type, methods: list[str], prefix: str) -> type:
    """A subclass of ``cls`` adding each method's wall time to PHASES[prefix + name]."""

    def wrap(name: str) -> Any:
        real = getattr(cls, name)

        def method(self: Any, *a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return real(self, *a, **k)
            finally:
                PHASES[prefix + name] += time.perf_counter() - t0

        return method

    return type(f"Timed{cls.__name__}", (cls,), {m: wrap(m) for m in methods})


Planner = timed(ht.SavePlanner, ["set_up_planner", "create_local_plan", "create_global_plan", "finish_plan"], "plan ")
Writer = timed(ht.FileSystemWriter, ["prepare_local_plan", "prepare_global_plan", "write_data", "finish"], "write ")
Reader = timed(ht.FileSystemReader, ["read_metadata", "read_data"], "read ")
LoadPlanner = timed(ht.LoadPlanner, ["set_up_planner", "create_local_plan"], "load plan ")


def fresh(d: str, host: Host) -> None:
    shutil.rmtree(d, ignore_errors=True)
    host.drop_caches()


def sync_save(sd: dict, d: str, hostreg: bool) -> float:
    t0 = time.perf_counter()
    if hostreg:
        dcp.save(sd, storage_writer=Writer(d), planner=Planner())
    else:
        dcp.save(sd, checkpoint_id=d)
    return time.perf_counter() - t0


def async_save(sd: dict, d: str, stager: Any) -> float:
    t0 = time.perf_counter()
    res = dcp.async_save(sd, storage_writer=Writer(d), planner=Planner(), async_stager=stager)
    res.upload_completion.result()
    return time.perf_counter() - t0


def verify(d: str, host: Host) -> float:
    """hostreg verify's check of every byte of the checkpoint, page cache dropped first."""
    from hostreg.torch._checkpoint.verify import verify_checkpoint

    host.drop_caches()
    t0 = time.perf_counter()
    report = verify_checkpoint(d)
    took = time.perf_counter() - t0
    if report.problems:
        raise RuntimeError(f"verify found {len(report.problems)} problems (first: {report.problems[0]})")
    return took


def load(sd: dict, dest: dict, d: str, hostreg: bool, host: Host, verified: bool = False) -> float:
    host.drop_caches()
    for t in dest["model"].values():
        t.zero_()
    t0 = time.perf_counter()
    if hostreg:
        dcp.load(dest, storage_reader=Reader(d, verify=verified), planner=LoadPlanner())
    else:
        dcp.load(dest, checkpoint_id=d)
    took = time.perf_counter() - t0
    bad = [k for k, v in sd["model"].items() if not torch.equal(v, dest["model"][k])]
    if bad:
        raise RuntimeError(f"{len(bad)} tensors differ after the load (first: {bad[:3]})")
    return took


def one_count(n: int, nbytes: int, root: str, host: Host, with_stock: bool, console: Console) -> dict[str, Any]:
    ht.clear_plan_cache()
    sd = random_state_dict(n, nbytes, seed=n)
    d = os.path.join(root, f"n{n}")
    out: dict[str, Any] = {"n": n}
    ceil = ceilings(nbytes, 1, root, host, ["io_uring", "psync"])
    out["ceiling write"], out["ceiling read"] = ceil["ceiling write"][0]["s"], ceil["ceiling read"][0]["s"]
    if with_stock:
        fresh(d, host)
        out["stock first"] = sync_save(sd, d, False)
        out["stock repeated"] = sync_save(sd, d, False)
    fresh(d, host)
    out["hostreg first"] = sync_save(sd, d, True)
    out["hostreg repeated"] = sync_save(sd, d, True)
    ht.clear_plan_cache()
    stager = ht.Stager(async_staging=True)
    try:
        fresh(d, host)
        out["async first"] = async_save(sd, d, stager)
        PHASES.clear()
        out["async repeated"] = statistics.median(async_save(sd, d, stager) for _ in range(3))
        out["phases save"] = {k: v / 3 for k, v in PHASES.items()}
    finally:
        stager.close()
    dest = ht.create_cpu_state_dict(sd, pin_memory=True)
    if with_stock:
        out["stock load"] = load(sd, dest, d, False, host)
    PHASES.clear()
    out["hostreg load"] = load(sd, dest, d, True, host)
    out["phases load"] = dict(PHASES)
    out["verify"] = verify(d, host)
    out["hostreg load, verify=True"] = load(sd, dest, d, True, host, verified=True)
    del dest
    shutil.rmtree(d, ignore_errors=True)
    console.print(f"  {n:,} items done")
    return out


ROWS = [
    ("stock first", "ceiling write"),
    ("stock repeated", "ceiling write"),
    ("hostreg first", "ceiling write"),
    ("hostreg repeated", "ceiling write"),
    ("async first", "ceiling write"),
    ("async repeated", "ceiling write"),
    ("stock load", "ceiling read"),
    ("hostreg load", "ceiling read"),
    ("verify", "ceiling read"),
    ("hostreg load, verify=True", "ceiling read"),
]


def tables(results: list[dict[str, Any]], mib: int) -> list[Table]:
    main = Table(
        title=f"{mib} MiB as N fp32 tensors: seconds, x ceiling (time over time), us per item above the ceiling"
    )
    main.add_column("what")
    for r in results:
        main.add_column(f"{r['n']:,}", justify="right")
    for key in ("ceiling write", "ceiling read"):
        main.add_row(key, *[f"{r[key]:.3f} s" for r in results])
    for key, ceil in ROWS:
        cells = []
        for r in results:
            if key not in r:
                cells.append("-")
                continue
            s = r[key]
            cells.append(f"{s:.3f} s  {s / r[ceil]:.2f}x  {1e6 * (s - r[ceil]) / r['n']:.1f} us")
        main.add_row(key, *cells)
    phases = Table(title="hostreg by phase: repeated async save (mean of 3) and load, wall seconds in each method")
    phases.add_column("phase")
    for r in results:
        phases.add_column(f"{r['n']:,}", justify="right")
    names = sorted({k for r in results for k in (*r["phases save"], *r["phases load"])})
    for name in names:
        phases.add_row(name, *[f"{r['phases save'].get(name, r['phases load'].get(name, 0.0)):.3f}" for r in results])
    return [main, phases]


def targets(results: list[dict[str, Any]]) -> list[str]:
    by = {r["n"]: r for r in results}
    out = []

    def line(ok: bool, text: str) -> None:
        out.append(f"{'met   ' if ok else 'MISSED'} {text}")

    for n, limit in ((8192, 1.5), (65536, 2.0)):
        if n in by:
            x = by[n]["async repeated"] / by[n]["ceiling write"]
            line(x <= limit, f"repeated async save, {n:,} items: {x:.2f}x the write ceiling (<= {limit})")
    for r in results:
        if "stock first" in r and r["n"] >= 8192:  # the state dicts; fewer items are the disk's
            x = r["hostreg first"] / r["stock first"]
            line(x <= 0.3, f"first hostreg save, {r['n']:,} items: {x:.2f}x stock's first save (<= 0.3)")
    if 65536 in by and "stock load" in by[65536]:
        r = by[65536]
        x, vs = r["hostreg load"] / r["ceiling read"], r["hostreg load"] / r["stock load"]
        line(x <= 2.0, f"hostreg load, 65,536 items: {x:.2f}x the read ceiling (<= 2)")
        line(vs <= 1 / 3, f"hostreg load, 65,536 items: {vs:.2f}x stock's time (<= 0.33)")
    # Per item: the repeated save's work outside write_data (planning, the metadata), which no
    # disk speed hides; write_data's own share follows the bytes.
    per = {n: sum(v for k, v in by[n]["phases save"].items() if k != "write write_data") / n for n in by if n >= 8192}
    if len(per) > 1:
        lo, hi = min(per.values()), max(per.values())
        text = ", ".join(f"{1e6 * v:.2f}" for v in per.values())
        line(
            hi <= 2 * max(lo, 1e-9),
            f"repeated async save, us per item outside write_data from 8,192 on: {text} (flat: max <= 2x min)",
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="without 262,144 items")
    ap.add_argument("--mib", type=int, default=256, help="the state dict's size (MiB)")
    ap.add_argument("--dir", default=None, help="where to save (default: a new folder in the current directory)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    console = Console()
    counts = [1024, 8192, 65536] + ([] if args.quick else [262144])
    root = tempfile.mkdtemp(prefix="items-bench-", dir=args.dir or os.getcwd())
    host = Host()
    try:
        results = [one_count(n, args.mib * MiB, root, host, n <= 65536, console) for n in counts]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for t in tables(results, args.mib):
        console.print(t)
    for line in targets(results):
        console.print(line)
    if host.drop_failed:
        console.print(f"(page cache not dropped: {host.drop_failed})")


if __name__ == "__main__":
    main()
