"""Checks built wheels (scripts/wheels runs it): each must be labelled manylinux_2_28 or lower
by ``auditwheel show``, need no shared library beyond the wheel's own, glibc's and zlib (all in
the manylinux policy), and weigh at most 2 MB. Prints a table; exits 1 naming what failed.

Usage: python scripts/check_wheel.py WHEEL...
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

MAX_BYTES = 2_000_000
MAX_GLIBC = (2, 28)
# What the shared objects may load: glibc's libraries, zlib (both in auditwheel's manylinux
# policy), and the wheel's own libhostreg.so.
ALLOWED = {
    "libc.so.6",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
    "libz.so.1",
    "libhostreg.so",
}


def needed(path: Path) -> list[str]:
    """DT_NEEDED entries of an ELF file (readelf reads any architecture's)."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def platform_tag(wheel: Path) -> str:
    """The tag ``auditwheel show`` says the wheel is consistent with ("" if none)."""
    r = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(wheel)], capture_output=True, text=True)
    m = re.search(r'consistent\s+with\s+the\s+following\s+platform\s+tag:\s+"([^"]+)"', r.stdout)
    return m.group(1) if m else ""


def check(wheel: Path) -> tuple[list[str], list[str]]:
    """(row of the table, problems)."""
    problems = []
    size = wheel.stat().st_size
    if size > MAX_BYTES:
        problems.append(f"{wheel.name}: {size:,} bytes, over {MAX_BYTES:,}")
    tag = platform_tag(wheel)
    m = re.match(r"manylinux_(\d+)_(\d+)_", tag)
    if not m or (int(m.group(1)), int(m.group(2))) > MAX_GLIBC:
        problems.append(f"{wheel.name}: auditwheel show says {tag or 'no manylinux tag'}, not manylinux_2_28 or lower")
    libs: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.endswith(".so"):
                libs.update(needed(Path(z.extract(name, tmp))))
    extra = sorted(libs - ALLOWED)
    if extra:
        problems.append(f"{wheel.name}: needs {', '.join(extra)}, outside the manylinux policy's libraries")
    return [wheel.name, f"{size:,}", tag, ", ".join(sorted(libs))], problems


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    table = Table(title="Wheels (auditwheel show, DT_NEEDED)")
    for col in ("wheel", "bytes", "auditwheel: consistent with", "shared libraries needed"):
        table.add_column(col, justify="right" if col == "bytes" else "left")
    problems = []
    for arg in argv:
        row, p = check(Path(arg))
        table.add_row(*row)
        problems += p
    Console(width=160).print(table)
    for p in problems:
        print(f"check_wheel: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
