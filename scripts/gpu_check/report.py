"""The check's table, its log file and its machine-readable results."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class Row:
    id: str
    check: str
    result: str = "FAIL"  # PASS | FAIL | INFO (measured, no target) | SKIP (could not run)
    figure: str = "not reported"

    def judge(self, problems: list[str], figure: str) -> None:
        """PASS with ``figure``, or FAIL naming the problems."""
        self.result = "FAIL" if problems else "PASS"
        self.figure = "; ".join(problems) or figure


class Report:
    """Rows of the final table, ``check.log`` (every detail) and ``results.json`` in log_dir."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(log_dir / "check.log", "w", buffering=1)
        self.rows: list[Row] = []
        self.data: dict[str, Any] = {}  # details for results.json

    def log(self, msg: str) -> None:
        self._log.write(f"[{time.strftime('%H:%M:%S')}] {msg}\n")

    def say(self, msg: str) -> None:
        print(msg, flush=True)
        self.log(msg)

    def ok(self) -> bool:
        return all(r.result in ("PASS", "INFO") for r in self.rows)

    def table(self) -> str:
        rows = [Row("step", "check", "result", "key figure"), *self.rows]
        w = [max(len(getattr(r, f)) for r in rows) for f in ("id", "check", "result")]
        lines = [f"{r.id:<{w[0]}}  {r.check:<{w[1]}}  {r.result:<{w[2]}}  {r.figure}".rstrip() for r in rows]
        lines.insert(1, f"{'-' * w[0]}  {'-' * w[1]}  {'-' * w[2]}  {'-' * 10}")
        good = sum(r.result in ("PASS", "INFO") for r in self.rows)
        verdict = "PASS" if self.ok() else "FAIL"
        return "\n".join([*lines, "", f"overall: {verdict} ({good}/{len(self.rows)} rows PASS or INFO)"])

    def close(self) -> str:
        table = self.table()
        (self.log_dir / "table.txt").write_text(table + "\n")
        results = {"ok": self.ok(), "rows": [asdict(r) for r in self.rows], "details": self.data}
        (self.log_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
        self._log.close()
        return table
