"""``hostreg bench``: checkpoint saves and loads of a synthetic state dict, cold and warm,
against the disk's own ``O_DIRECT`` ceiling, from any install (a wheel too).

In one process, in ``--dir`` (default: the current directory), for ``--mib`` MiB as
``--tensors`` float32 tensors:

  ceiling       fio (or hostreg's own probe without fio, ``ceiling.py``): ``O_DIRECT`` write,
                then read, of the same bytes
  save, cold    the process's first ``dcp.save`` into a new directory, with
                ``hostreg.torch.FileSystemWriter`` and ``SavePlanner`` (straight from the
                tensors, no stager): the structure planned, the files allocated
  save, warm    the median of ``--repeats`` saves after it, over the same files
  load, cold    the first ``dcp.load`` with ``FileSystemReader`` and ``LoadPlanner`` into a
                pinned state dict (``create_cpu_state_dict``); ``O_DIRECT`` reads bypass the
                page cache, so "cold" is the process's first, not the disk's
  load, warm    the median of ``--repeats`` loads after it
  stock         with ``--stock``: DCP's own ``dcp.save`` and ``dcp.load``, first and repeated

Every load is compared with the source. Columns: seconds, GB/s, and "x ceiling": seconds
over the ceiling's seconds (1.00 is the disk's speed). The checkpoints are removed at the end.
Exit codes: 0 done, 1 a failure (the message says why), 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(args: argparse.Namespace) -> int:
    from . import _console, _kept_for_life, _needs_torch, esc

    if _needs_torch("bench"):
        return 1
    if args.mib <= 0 or args.tensors <= 0 or args.repeats <= 0:
        print("hostreg bench: --mib, --tensors and --repeats must be positive", file=sys.stderr)
        return 2
    if args.tensors > args.mib << 18:
        print(
            f"hostreg bench: --tensors is at most {args.mib << 18:,} for --mib {args.mib} (4-byte tensors)",
            file=sys.stderr,
        )
        return 2
    if not os.path.isdir(args.dir):
        print(f"hostreg bench: {args.dir} is not a directory", file=sys.stderr)
        return 2
    with _kept_for_life():
        import warnings

        import torch
        import torch.distributed.checkpoint as dcp

        import hostreg.torch as ht

        from . import ceiling
        from .checkpoint import _cause

    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    warnings.filterwarnings("ignore", message=".*Detected an existing checkpoint.*")  # stock's second save
    out = _console()
    nbytes = args.mib << 20
    per = max(1, nbytes // 4 // args.tensors)
    total = per * 4 * args.tensors
    rows: list[tuple[str, float]] = []
    root = None
    try:
        g = torch.Generator().manual_seed(0)
        sd = {f"t{i:06d}": torch.randn(per, generator=g) for i in range(args.tensors)}
        root = tempfile.mkdtemp(prefix=".hostreg-bench-", dir=args.dir)
        out.print(f"measuring the ceiling of {esc(args.dir)} for {total:,} bytes ...", style="dim")
        ceil = ceiling.measure(root, total)
        wceil, rceil = total / ceil.write, total / ceil.read
        rows += [(f"ceiling: write ({ceil.tool})", wceil), ("ceiling: read", rceil)]
        dest = ht.create_cpu_state_dict(sd, pin_memory=True)

        def check() -> None:
            bad = [k for k, v in sd.items() if not torch.equal(v, dest[k])]
            if bad:
                raise RuntimeError(f"{len(bad)} tensors loaded back with other values (first: {bad[0]})")

        def save(d: str) -> None:
            dcp.save(sd, storage_writer=ht.FileSystemWriter(d), planner=ht.SavePlanner(), no_dist=True)

        def load(d: str) -> None:
            for v in dest.values():
                v.fill_(float("nan"))
            dcp.load(dest, storage_reader=ht.FileSystemReader(d), planner=ht.LoadPlanner(), no_dist=True)
            check()

        d = os.path.join(root, "hostreg")
        rows.append(("hostreg save, cold (first, new directory)", _timed(lambda: save(d))))
        warm = [_timed(lambda: save(d)) for _ in range(args.repeats)]
        rows.append((f"hostreg save, warm (median of {args.repeats})", statistics.median(warm)))
        rows.append(("hostreg load, cold (first)", _timed(lambda: load(d))))
        warm = [_timed(lambda: load(d)) for _ in range(args.repeats)]
        rows.append((f"hostreg load, warm (median of {args.repeats})", statistics.median(warm)))
        if args.stock:
            s = os.path.join(root, "stock")
            rows.append(("stock dcp.save, first", _timed(lambda: dcp.save(sd, checkpoint_id=s, no_dist=True))))
            rows.append(("stock dcp.save, repeated", _timed(lambda: dcp.save(sd, checkpoint_id=s, no_dist=True))))

            def stock_load() -> None:
                dcp.load(dest, checkpoint_id=s, no_dist=True)
                check()

            rows.append(("stock dcp.load into the pinned state dict", _timed(stock_load)))
    except BaseException as e:  # DCP raises CheckpointException, a BaseException, for a rank's error
        cause = _cause(e)
        if isinstance(cause, KeyboardInterrupt):
            raise KeyboardInterrupt from None  # the CLI's "interrupted", exit 130
        if not isinstance(cause, (OSError, RuntimeError, MemoryError)):
            raise
        print(f"hostreg bench: {type(cause).__name__}: {cause}", file=sys.stderr)
        return 1
    finally:
        if root is not None:
            # Signals held off meanwhile: a second Ctrl-C must not leave the files behind.
            old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
            try:
                shutil.rmtree(root, ignore_errors=True)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, old)
    from rich.table import Table

    table = Table(title=f"{total:,} bytes as {args.tensors:,} float32 tensors in {esc(args.dir)}")
    for col in ("measurement", "seconds", "GB/s", "x ceiling"):
        table.add_column(col, justify="left" if col == "measurement" else "right")
    for name, secs in rows:
        base = rceil if "load" in name or "read" in name else wceil
        table.add_row(esc(name), f"{secs:.3f}", f"{total / secs / 1e9:.2f}", f"{secs / base:.2f}")
    out.print(table)
    out.print("x ceiling: seconds over the ceiling's seconds for the same bytes (saves: write; loads: read).")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench",
        help="time checkpoint saves and loads, cold and warm, against the disk's O_DIRECT ceiling",
        description="Save and load a synthetic state dict as a DCP checkpoint with hostreg's writer, reader and "
        "planners (and with --stock DCP's own), the first time and repeated, beside the disk's own O_DIRECT "
        "ceiling for the same bytes (fio when installed). Needs torch.",
    )
    b.add_argument("--dir", default=".", help="where to write (a temporary folder in it, removed after; default: .)")
    b.add_argument("--mib", type=int, default=256, help="MiB of tensors (default: %(default)s)")
    b.add_argument("--tensors", type=int, default=8, help="how many tensors (default: %(default)s)")
    b.add_argument("--repeats", type=int, default=3, help="warm runs, their median shown (default: %(default)s)")
    b.add_argument("--stock", action="store_true", help="also time DCP's own writer and reader")
    b.set_defaults(func=run)
