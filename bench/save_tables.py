"""bench/save_bench.py's table of one state dict's results, with the targets marked.
Imported by save_bench.py (run that)."""

from __future__ import annotations

import statistics
from types import SimpleNamespace
from typing import Any

from common import MiB
from rich.table import Table
from save_parts import DCP1, FLOOR, HR, LOAD_FROM, READERS, WRITERS


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
        "x stock",
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
                ok = s / stock <= 1 / 1.5
                targets = f"x stock {mark(ok)}"
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
                f"{s / stock:.2f}",
                io_note(res["stats"].get(key)),
                targets,
            )
    return table, misses
