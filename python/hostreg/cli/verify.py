"""``hostreg verify DIR``: every byte of a DCP checkpoint checked against what was saved
(``hostreg.torch._checkpoint.verify``), with a table of what differs, naming the file, the
tensor and the byte offset. Exit codes: 0 intact, 1 a problem found, 2 bad usage."""

from __future__ import annotations

import argparse
import os
import time


def run(args: argparse.Namespace) -> int:
    from . import _console, _kept_for_life, _needs_torch, esc

    if _needs_torch("verify"):
        return 1
    out = _console()
    if not os.path.isdir(args.dir):
        print(f"hostreg verify: {args.dir} is not a directory")
        return 2
    with _kept_for_life():
        from ..torch._checkpoint.verify import verify_checkpoint
    t0 = time.perf_counter()
    report = verify_checkpoint(args.dir, trusted=args.trusted)
    took = time.perf_counter() - t0
    from rich.table import Table

    if report.problems:
        table = Table(title=f"{esc(args.dir)}: {len(report.problems)} problem(s)")
        for col in ("file", "tensor", "byte", "what"):
            table.add_column(col)
        for p in report.problems[: args.max_problems]:
            table.add_row(esc(p.file), esc(p.item or "-"), f"{p.offset:,}", esc(p.what))
        out.print(table)
        if len(report.problems) > args.max_problems:
            out.print(f"... and {len(report.problems) - args.max_problems} more")
        return 1
    rate = report.nbytes / took / 1e9 if took > 0 else 0.0
    out.print(
        f"{esc(args.dir)}: intact ({', '.join(report.metadata)}; {report.files} file(s), {report.items:,} items, "
        f"{report.nbytes:,} bytes, every byte checked in {took:.2f} s, {rate:.2f} GB/s)"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser(
        "verify",
        help="check every byte of a DCP checkpoint against what was saved",
        description="Check a DCP checkpoint (hostreg's or DCP's own writer's): the metadata (its CRC-32 where "
        "hostreg wrote it; read as data, not run as a pickle), and every container of every data file (its ZIP "
        "structure and each record's CRC-32); print what differs, naming the file, the tensor and the byte.",
    )
    v.add_argument("dir", metavar="DIR", help="the checkpoint's directory")
    v.add_argument(
        "--trusted",
        action="store_true",
        help="unpickle the metadata as DCP does (it may run code: only for checkpoints whose origin you trust)",
    )
    v.add_argument("--max-problems", type=int, default=50, help="problems shown (default: %(default)s)")
    v.set_defaults(func=run)
