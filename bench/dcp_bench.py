"""DCP benchmark: ``dcp.async_save`` to local disk through hostreg's Stager against DCP's own
DefaultStager, end to end.

Run (after scripts/setup):  .venv/bin/python bench/dcp_bench.py [--quick] [--reps N]

State dicts (one run, all in it):
  fsdp-gpt2-medium  2 ranks over gloo, a GPT-2-medium-shaped model (355 M parameters) sharded
                    by FSDP2 (fully_shard per block and the root) with its AdamW state, from
                    get_state_dict: DTensors, 0-d step tensors, param_groups
  8 x 256 MiB       2 GiB in 8 fp32 tensors, one process (under one "model" key)
  8192 x 256 KiB    2 GiB in 8,192 fp32 tensors, one process (under one "model" key)
Stagers:
  hostreg sync      hostreg.torch.Stager()
  hostreg async     hostreg.torch.Stager(async_staging=True)
  DCP pinned sync   DefaultStager(StagingOptions(True, True, False, False))
  DCP async         DefaultStager(StagingOptions())
Both DefaultStager configurations pin through hostreg's drop-in in the state Ascend's
transfer_to_npu leaves a CPU build of torch in (torch.cuda.is_available() True while the
stager is made, torch.cuda.cudart() None; StagingOptions() also gets an accelerator stand-in,
the CPU, for its stream). Each stager is made afresh per repetition: its first save is
"cold" (staging memory made and pinned), the second "warm". Times per save: "blocked" (until
async_save returns), "staged" (until staging is complete: the source may change) and "done"
(until the checkpoint is written), the slowest rank's, median over --reps repetitions, with
the thread and the process checkpointer (the background process is started before timing).

Targets (checked in the last table, from the medians of this run):
  hostreg async blocks no longer than DCP async, cold and warm;
  hostreg (its faster mode) is done no later than the fastest DefaultStager configuration,
  cold and warm, with both checkpointer types;
  hostreg sync blocks at most 0.6x as long as DCP pinned sync, cold and warm.
Not a test: it prints tables; read the ratios (the machine may be shared and noisy).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from rich.console import Console
from rich.table import Table
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

import hostreg.torch as ht

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MiB, ascend_state, free_port, fsdp_state_dict, plain_state_dict, state_bytes  # noqa: E402

STAGERS = ["hostreg sync", "hostreg async", "DCP pinned sync", "DCP async"]
CHECKPOINTERS = ["thread", "process"]
PHASES = ["cold", "warm"]


# ---- stagers ---------------------------------------------------------------------------------


def make_stager(name: str) -> Any:
    if name == "hostreg sync":
        return ht.Stager()
    if name == "hostreg async":
        return ht.Stager(async_staging=True)
    options = StagingOptions(True, True, False, False) if name == "DCP pinned sync" else StagingOptions()
    saved = torch.cuda.is_available, torch.accelerator.is_available
    torch.cuda.is_available = lambda: True  # type: ignore[assignment]  # the NPU's answer under transfer_to_npu
    if name == "DCP async":
        torch.accelerator.is_available = lambda: True  # type: ignore[assignment]  # the CPU stands in
    try:
        return DefaultStager(options)
    finally:
        torch.cuda.is_available, torch.accelerator.is_available = saved  # type: ignore[assignment]


# ---- one rank ----------------------------------------------------------------------------------


def one_save(sd: Any, stager: Any, path: str, checkpointer: Any, pg: Any) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    res = dcp.async_save(
        sd, checkpoint_id=path, async_stager=stager, async_checkpointer_type=checkpointer, process_group=pg
    )
    blocked = time.perf_counter() - t0
    if isinstance(res, state_dict_saver.AsyncSaveResponse):
        res.staging_completion.result()
        staged = time.perf_counter() - t0
        res.upload_completion.result()
    else:
        staged = blocked
        res.result()
    return blocked, staged, time.perf_counter() - t0


def rank_main(rank: int, world: int, port: int, case: dict, opts: dict, out: str) -> None:
    warnings.filterwarnings("ignore")
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=1800)
    )
    pg = dist.new_group(backend="gloo")  # saves' collectives apart from the default group's
    if case["kind"] == "fsdp":
        sd = fsdp_state_dict(case["model"], world)
    else:
        sd = plain_state_dict(case["count"], case["nbytes"])
    nbytes = state_bytes(sd)
    root = opts["dir"]
    kinds = {name: getattr(state_dict_saver.AsyncCheckpointerType, name.upper()) for name in opts["checkpointers"]}
    if "process" in kinds:  # start the background process before anything is timed
        warm_dir = f"{root}/warmup"
        dcp.async_save(
            {"x": torch.ones(1)}, checkpoint_id=warm_dir, async_checkpointer_type=kinds["process"], process_group=pg
        ).result()
    samples: dict[str, list[tuple[float, float, float]]] = {}
    with ascend_state():
        for rep in range(opts["reps"]):
            for ck in opts["checkpointers"]:
                # A different stager goes first in each repetition: on a VM, the first fresh
                # memory of a run costs more than memory given back and taken again.
                order = opts["stagers"][rep % len(opts["stagers"]) :] + opts["stagers"][: rep % len(opts["stagers"])]
                for name in order:
                    stager = make_stager(name)
                    for phase in PHASES:
                        path = f"{root}/{ck}-{name.replace(' ', '_')}-{rep}-{phase}"
                        dist.barrier()
                        times = one_save(sd, stager, path, kinds[ck], pg)
                        samples.setdefault(f"{ck}|{name}|{phase}", []).append(times)
                        gc.collect()
                        dist.barrier()
                        if rank == 0:
                            shutil.rmtree(path, ignore_errors=True)
                    stager.close()
                    del stager
                    gc.collect()
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (nbytes, samples))
    if rank == 0:
        total = sum(n for n, _ in gathered)
        slowest = {}
        for key in samples:
            per_rank = [s[key] for _, s in gathered]
            slowest[key] = [tuple(max(r[i][j] for r in per_rank) for j in range(3)) for i in range(len(per_rank[0]))]
        with open(out, "w") as f:
            json.dump({"bytes": total, "samples": slowest}, f)
    dist.barrier()
    dist.destroy_process_group()


def run_case(case: dict, opts: dict) -> dict:
    with tempfile.TemporaryDirectory(dir=opts["parent"]) as d:
        out = os.path.join(d, "result.json")
        mp.spawn(
            rank_main, args=(case["world"], free_port(), case, {**opts, "dir": d}, out), nprocs=case["world"], join=True
        )
        with open(out) as f:
            return json.load(f)


# ---- tables --------------------------------------------------------------------------------


def median(samples: list[list[float]], i: int) -> float:
    return statistics.median(s[i] for s in samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller state dicts (GPT-2 small, 256 MiB), for a smoke run")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per measurement (median; default 3)")
    ap.add_argument(
        "--dir", default=None, help="where checkpoints are written (default: a temporary directory in /tmp)"
    )
    ap.add_argument("--json", default=None, help="also write every sample here")
    ap.add_argument(
        "--cases", default="fsdp,8,8192", help="which state dicts, comma-separated (default: all: fsdp,8,8192)"
    )
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    size = 256 * MiB if args.quick else 2048 * MiB
    cases = [
        {
            "name": f"fsdp-{'gpt2' if args.quick else 'gpt2-medium'} + AdamW, 2 ranks",
            "kind": "fsdp",
            "model": "gpt2" if args.quick else "gpt2-medium",
            "world": 2,
        },
        {"name": f"{size // MiB} MiB in 8 tensors", "kind": "plain", "count": 8, "nbytes": size // 8, "world": 1},
        {
            "name": f"{size // MiB} MiB in 8,192 tensors",
            "kind": "plain",
            "count": 8192,
            "nbytes": size // 8192,
            "world": 1,
        },
    ]
    chosen = set(args.cases.split(","))
    if not chosen <= {"fsdp", "8", "8192"}:
        ap.error(f"--cases: unknown {sorted(chosen - {'fsdp', '8', '8192'})}; known: fsdp, 8, 8192")
    cases = [c for c, key in zip(cases, ["fsdp", "8", "8192"]) if key in chosen]
    opts = {
        "reps": args.reps,
        "stagers": STAGERS,
        "checkpointers": CHECKPOINTERS,
        "parent": args.dir or tempfile.gettempdir(),
    }
    console = Console(width=max(Console().width, 140))
    console.print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs; median of {args.reps}; times in seconds "
        "(blocked / staged / done, the slowest rank's)"
    )
    results = {}
    for case in cases:
        console.print(f"running {case['name']} ...")
        results[case["name"]] = run_case(case, opts)

    table = Table(title="dcp.async_save through each stager")
    for col in [
        "state dict",
        "checkpointer",
        "stager",
        "cold blocked",
        "cold staged",
        "cold done",
        "warm blocked",
        "warm staged",
        "warm done",
    ]:
        table.add_column(col, justify="left" if col in ("state dict", "checkpointer", "stager") else "right")
    for cname, res in results.items():
        s = res["samples"]
        label = f"{cname} ({res['bytes'] / MiB / 1024:.2f} GiB)"
        for ck in CHECKPOINTERS:
            for name in STAGERS:
                row = [label, ck, name]
                for phase in PHASES:
                    row += [f"{median(s[f'{ck}|{name}|{phase}'], i):.4f}" for i in range(3)]
                table.add_row(*row)
                label = ""
            table.add_section()
    console.print(table)

    targets = Table(title="targets (ratios of medians; <= 1 meets the target)")
    for col in ["state dict", "checkpointer", "phase", "target", "hostreg", "baseline", "ratio", "result"]:
        targets.add_column(
            col, justify="left" if col in ("state dict", "checkpointer", "phase", "target", "result") else "right"
        )
    misses = 0
    for cname, res in results.items():
        s = res["samples"]
        for ck in CHECKPOINTERS:
            for phase in PHASES:

                def m(name: str, i: int) -> float:
                    return median(s[f"{ck}|{name}|{phase}"], i)

                checks = [
                    ("async blocks <= DCP async", m("hostreg async", 0), m("DCP async", 0), 1.0),
                    (
                        "done <= fastest DefaultStager",
                        min(m("hostreg sync", 2), m("hostreg async", 2)),
                        min(m("DCP pinned sync", 2), m("DCP async", 2)),
                        1.0,
                    ),
                    ("sync blocks <= 0.6x DCP pinned sync", m("hostreg sync", 0), m("DCP pinned sync", 0), 0.6),
                ]
                for what, ours, base, limit in checks:
                    ratio = ours / base if base > 0 else float("inf")
                    ok = ratio <= limit
                    misses += not ok
                    targets.add_row(
                        cname, ck, phase, what, f"{ours:.4f}", f"{base:.4f}", f"{ratio:.2f}", "PASS" if ok else "MISS"
                    )
    console.print(targets)
    console.print(f"targets missed: {misses}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
