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
import dataclasses
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
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from dcp_bench import MiB, free_port, fsdp_state_dict, plain_state_dict, state_bytes  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from torch.distributed.checkpoint import state_dict_saver  # noqa: E402
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult  # noqa: E402
from torch.futures import Future  # noqa: E402

import hostreg  # noqa: E402
import hostreg.torch as ht  # noqa: E402
from hostreg.cli.ceiling import fio  # noqa: E402


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
        p = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *files], capture_output=True, text=True
        )
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


def copy_structure(sd: Any) -> Any:
    """A state dict like ``sd`` with tensors of its own (DTensors over the same mesh and
    placements): a destination to load into."""
    import copy

    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map

    def one(v: Any) -> Any:
        if isinstance(v, DTensor):
            return DTensor.from_local(
                v.to_local().clone(), v.device_mesh, v.placements, shape=v.shape, stride=v.stride(), run_check=False
            )
        return v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)

    return tree_map(one, sd)


def verify(src: list[torch.Tensor], dest: list[torch.Tensor], what: str) -> None:
    bad = [i for i, (a, b) in enumerate(zip(src, dest)) if not torch.equal(a, b)]
    if bad or len(src) != len(dest):
        raise RuntimeError(
            f"{what}: {len(bad)} of {len(src)} tensors differ from the source after the load (first: {bad[:5]})"
        )


# ---- one case ----------------------------------------------------------------------------------


def one_save(sd: dict[str, Any], stager: Any, path: str, writer: Any, pg: Any = None) -> tuple[float, float]:
    t0 = time.perf_counter()
    res = dcp.async_save(sd, checkpoint_id=path, storage_writer=writer, async_stager=stager, process_group=pg)
    if not isinstance(res, state_dict_saver.AsyncSaveResponse):
        raise RuntimeError(
            f"dcp.async_save returned {type(res).__name__}, not an AsyncSaveResponse: "
            "this torch does not take a staging future"
        )
    res.staging_completion.result()
    staged = time.perf_counter() - t0
    res.upload_completion.result()
    done = time.perf_counter() - t0
    del res
    return staged, done


class Ranks:
    """The processes of one case: this one alone, or a gloo process group (every rank runs
    the same saves and loads; rank 0 alone drops caches, reads /proc/meminfo, removes files)."""

    def __init__(self, pg: Any = None) -> None:
        self.pg = pg
        self.root = pg is None or dist.get_rank() == 0

    def barrier(self) -> None:
        if self.pg is not None:
            dist.barrier(group=self.pg)

    def total(self, n: int) -> int:
        """The sum of ``n`` over the ranks."""
        if self.pg is None:
            return n
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, group=self.pg)
        return int(t.item())


def tensors_of(sd: Any) -> list[torch.Tensor]:
    """Every tensor of a (possibly FSDP2) state dict, DTensors as their local shards, in order."""
    from torch.utils._pytree import tree_leaves

    return [v.to_local() if hasattr(v, "to_local") else v for v in tree_leaves(sd) if isinstance(v, torch.Tensor)]


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


def med(res: dict[str, Any], key: str, field: str = "s") -> float:
    return statistics.median(s[field] for s in res["samples"][key])


def io_note(got: dict[str, Any] | None) -> str:
    if got is None:
        return ""
    st = SimpleNamespace(**got)
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
    cols = [
        "measurement",
        "staged s",
        "done s",
        "GB/s",
        "x ceiling",
        "x DCP tc=1",
        "storage s",
        "storage x ceiling",
        "page cache +%",
        "ckpt cached %",
        "speedup vs stock",
        "I/O (last run)",
        "targets",
    ]
    for c in cols:
        table.add_column(c, justify="left" if c in ("measurement", "I/O (last run)", "targets") else "right")
    table.add_row("fio O_DIRECT write ceiling", "", f"{wceil:.3f}", f"{n / wceil / 1e9:.2f}", "1.00", *[""] * 8)
    table.add_row("fio O_DIRECT read ceiling", "", f"{rceil:.3f}", f"{n / rceil / 1e9:.2f}", "1.00", *[""] * 8)
    table.add_section()
    misses = 0
    for name, _ in WRITERS:
        s, staged, cache = med(res, name), med(res, name, "staged"), med(res, name, "cache")
        if name == FLOOR:
            table.add_row(
                f"save {name}", f"{staged:.3f}", f"{s:.3f}", "", f"{s / wceil:.2f}", f"{s / base:.2f}", *[""] * 7
            )
            continue
        resident = med(res, name, "resident")
        targets = ""
        if name.startswith("hostreg"):
            checks = [("ceiling", s / wceil <= 1.15), ("DCP", s / base <= 0.5), ("cache", cache <= 5.0)]
            targets = " ".join(f"{what} {mark(ok)}" for what, ok in checks)
            if name == HR:
                misses += sum(not ok for _, ok in checks)
        table.add_row(
            f"save {name}",
            f"{staged:.3f}",
            f"{s:.3f}",
            f"{n / s / 1e9:.2f}",
            f"{s / wceil:.2f}",
            f"{s / base:.2f}",
            f"{s - floor:.3f}",
            f"{(s - floor) / wceil:.2f}",
            f"{round(cache, 1) + 0.0:.1f}",
            f"{resident:.1f}",
            "",
            io_note(res["stats"].get(name)),
            targets,
        )
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
            cache = med(res, key, "cache")
            table.add_row(
                f"load {short} ckpt: {reader}",
                "",
                f"{s:.3f}",
                f"{n / s / 1e9:.2f}",
                f"{s / rceil:.2f}",
                "",
                "",
                "",
                f"{round(cache, 1) + 0.0:.1f}",
                "",
                f"{stock / s:.2f}",
                io_note(res["stats"].get(key)),
                targets,
            )
    return table, misses


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
            'thread_count=1 ("DCP"); page-cache growth <= 5% ("cache"); hostreg load >= 1.5x faster than stock '
            'dcp.load of the same checkpoint ("speedup").',
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
