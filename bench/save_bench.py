"""Checkpoint I/O benchmark: hostreg's FileSystemWriter and FileSystemReader against DCP's own
and against the filesystem's O_DIRECT ceiling, end to end through ``dcp.async_save`` and
``dcp.load``.

Run (after scripts/setup):  .venv/bin/python bench/save_bench.py [--quick] [--reps N] [--dir D]

State dicts (dcp_bench's builders, filled with random values):
  fsdp            2 ranks over gloo, a GPT-2-medium-shaped model (355 M parameters) sharded by
                  FSDP2 with its AdamW state (4.3 GB in all; GPT-2 small with --quick); each
                  rank saves and loads its shards, times are the slowest rank's
  8 tensors       one process, 2 GiB in 8 fp32 tensors (under one "model" key)
  8192 tensors    one process, 2 GiB in 8,192 fp32 tensors
(--quick: 256 MiB each; --size-mib overrides).

Per state dict, in one run:
  ceilings  fio, O_DIRECT, 16 MiB requests, iodepth 4 (io_uring, else psync), end_fsync:
            sequential write of the same bytes in the target directory, then sequential read
            of that file; seconds = bytes / bandwidth
  saves     dcp.async_save(sd, checkpoint_id=d, storage_writer=W,
            async_stager=hostreg.torch.Stager(async_staging=True)), thread checkpointer, timed
            from the call until upload_completion.result() returns ("done"; "staged" until
            staging_completion), for W = DCP's FileSystemWriter(thread_count=1) (its default),
            (thread_count=2), and hostreg's FileSystemWriter (default: thread_count per disk; 1, 2, 4, 8
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
<= 0.5x DCP's default writer (thread_count=1); hostreg's load <= 0.67x stock's time
dcp.load; page-cache growth during hostreg's save <= 5%.
Not a test: it prints tables; read the ratios (the machine may be shared and noisy).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from common import MiB, free_port, fsdp_state_dict, state_bytes  # noqa: E402
from rich.console import Console  # noqa: E402
from save_measure import ceilings, idle_note, measure_saves  # noqa: E402
from save_parts import (  # noqa: E402
    FLOOR,
    Host,
    Ranks,
    copy_structure,
    random_state_dict,
    tensors_of,
    zeros_like_sd,
)
from save_tables import case_table  # noqa: E402


def fsdp_case(model: str, reps: int, root: str, host: Host, engines: list[str], console: Console) -> dict[str, Any]:
    """Both ranks' saves and loads (the slowest rank's times), then the ceilings for their bytes."""
    out = os.path.join(root, "fsdp.json")
    mp.spawn(fsdp_rank, args=(2, free_port(), model, reps, root, out), nprocs=2, join=True)
    with open(out) as f:
        res = json.load(f)
    os.unlink(out)
    res["samples"].update(ceilings(res["bytes"], reps, root, host, engines))
    console.print(f"  ceilings measured (fio, {engines[0]})")
    res["notes"].append(idle_note(host, res["bytes"]))
    res["count"] = 0
    return res


def run_case(
    count: int, total: int, reps: int, root: str, host: Host, engines: list[str], console: Console
) -> dict[str, Any]:
    t = time.perf_counter()
    sd = random_state_dict(count, total, seed=count)
    nbytes = state_bytes(sd)
    dest = zeros_like_sd(sd)
    console.print(f"  state dict and destination made ({nbytes / MiB:.0f} MiB each, {time.perf_counter() - t:.1f} s)")
    samples = ceilings(nbytes, reps, root, host, engines)
    console.print(f"  ceilings measured (fio, {engines[0]})")
    try:
        got, extra, notes = measure_saves(sd, dest, reps, root, host, Ranks(), console)
        notes.add(idle_note(host, nbytes))
    finally:
        del sd, dest
        gc.collect()
    return {"bytes": nbytes, "count": count, "samples": {**samples, **got}, "stats": extra, "notes": sorted(notes)}


def fsdp_rank(rank: int, world: int, port: int, model: str, reps: int, root: str, out: str) -> None:
    """One rank of the FSDP2 case: its shard of the model and AdamW state, every save and load."""
    warnings.filterwarnings("ignore")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=3600)
    )
    pg = dist.new_group(backend="gloo")
    sd = fsdp_state_dict(model, world)
    for x in tensors_of(sd):  # values of their own: an equality check after a load means something
        if x.is_floating_point() and x.dim() > 0:
            x.uniform_(-1.0, 1.0, generator=torch.Generator().manual_seed(rank * 7919 + x.numel()))
    console = Console(width=240)
    samples, extra, notes = measure_saves(sd, copy_structure(sd), reps, root, Host(), Ranks(pg), console)
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (state_bytes(sd), samples, extra, sorted(notes)))
    if rank == 0:
        merged: dict[str, list[dict[str, float]]] = {}
        for key, runs in samples.items():  # the slowest rank's time; rank 0's page-cache figures (machine-wide)
            merged[key] = [
                dict(
                    run,
                    s=max(g[1][key][i]["s"] for g in gathered),
                    **({"staged": max(g[1][key][i]["staged"] for g in gathered)} if "staged" in run else {}),
                )
                for i, run in enumerate(runs)
            ]
        with open(out, "w") as f:
            json.dump(
                {
                    "bytes": sum(g[0] for g in gathered),
                    "samples": merged,
                    "stats": extra,
                    "notes": sorted({n for g in gathered for n in g[3]}),
                },
                f,
            )
    dist.barrier()
    dist.destroy_process_group()


# ---- tables ------------------------------------------------------------------------------------


def main() -> int:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="256 MiB state dicts and --reps 1, for a smoke run")
    ap.add_argument("--reps", type=int, default=None, help="repetitions per measurement (median; default 3, --quick 1)")
    ap.add_argument(
        "--size-mib", type=int, default=None, help="bytes of each state dict in MiB (default 2048, --quick 256)"
    )
    ap.add_argument(
        "--dir", default=None, help="where checkpoints are written (default: a temporary directory in /tmp)"
    )
    ap.add_argument(
        "--cases",
        default="fsdp,8,8192",
        help="fsdp (FSDP2 GPT-2-medium + AdamW on 2 gloo ranks; GPT-2 small with --quick) and/or tensor "
        "counts, comma-separated (default: fsdp,8,8192)",
    )
    ap.add_argument("--json", default=None, help="also write every sample here")
    args = ap.parse_args()
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    if reps < 1:
        ap.error("--reps must be >= 1")
    size = (args.size_mib if args.size_mib is not None else (256 if args.quick else 2048)) * MiB
    chosen = args.cases.split(",")
    try:
        counts = [int(c) for c in chosen if c != "fsdp"]
    except ValueError:
        ap.error(f"--cases: not fsdp or tensor counts: {args.cases}")
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
        if "fsdp" in chosen:
            model = "gpt2" if args.quick else "gpt2-medium"
            title = f"FSDP2 {model} + AdamW, 2 ranks"
            console.print(f"running {title} ...")
            results[title] = fsdp_case(model, reps, root, host, engines, console)
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
            'thread checkpointer, warm; "done" = until upload_completion.result().',
            f'Ceilings: fio O_DIRECT, 16 MiB requests, iodepth 4, {engines[0]}, end_fsync; loads\' "x ceiling" is against the read ceiling.',
            "Page cache +%: growth of Cached + Dirty (/proc/meminfo) over the save, % of the bytes saved (it also counts library "
            "pages read back after drop_caches); ckpt cached %: the checkpoint's own files in the page cache right after the "
            "save (fincore), not judged.",
            'Targets: hostreg save done <= 1.15x the write ceiling ("ceiling") and <= 0.5x DCP\'s default writer, '
            'thread_count=1 ("DCP"); page-cache growth <= 5% ("cache"); hostreg load <= 0.67x the time of stock '
            'dcp.load of the same checkpoint ("x stock": time over stock\'s time).',
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
