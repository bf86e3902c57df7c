"""GPU verification of hostreg's ``cuda`` backend: ``python3 -m gpu_check`` (with ``scripts/``
on ``PYTHONPATH``), normally run by ``scripts/gpu_check.sh``, which builds and installs hostreg
with CMake first. Each step adds rows to one plain-text table, printed last; the exit status
is 0 only when every row is PASS or INFO (a measurement without a target).

  1  the build, and ``import hostreg, hostreg.torch`` without ``rich`` (checks.py)
  2  the bad-input cases sent to the CUDA runtime and to hostreg, answers compared (checks.py)
  3  what hostreg registers is Host memory to CUDA and pinned to torch (checks.py)
  4  ``cudart()`` returning None made to work by the drop-in; staging; Stager (scenario.py)
  5  device-to-host bandwidth and time to stage (d2h.py)

``--dry-run`` needs no GPU: hostreg's cuda backend and the check load the CUDA driver test
double (HOSTREG_CUDA_LIBRARY), tensors are CPU tensors, and step 5's rows are INFO.
Python 3.9+, the standard library and torch only.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from .checks import REPO, step_build, step_differential, step_registration
from .d2h import step_bandwidth
from .report import Report, Row
from .scenario import step_scenario

STEPS = [  # (number, rows, run, needs the build)
    (
        "1",
        [("1a", "build (cmake Release, nanobind extension)"), ("1b", "import hostreg, hostreg.torch without rich")],
        step_build,
        False,
    ),
    ("2", [("2", "bad-input answers: hostreg vs CUDA runtime")], step_differential, True),
    ("3", [("3", "hostreg-registered memory seen as pinned")], step_registration, True),
    (
        "4",
        [
            ("4a", "torch _create_cpu_state_dict, cudart()=None"),
            ("4b", "hostreg create/copy_state_dict from device"),
            ("4c", "hostreg.torch.Stager, stage twice"),
            ("4d", "Stager(async_staging=True) from device"),
        ],
        step_scenario,
        True,
    ),
    (
        "5",
        [
            ("5a", "D2H SIZE: hostreg vs pin_memory"),
            ("5b", "D2H SIZE: hostreg vs pageable"),
            ("5c", "D2H MODEL: hostreg vs pin_memory"),
            ("5d", "D2H MODEL: hostreg vs pageable"),
            ("5e", "D2H into mlock-only memory"),
            ("5f", "time to stage MODEL: hostreg vs torch"),
        ],
        step_bandwidth,
        True,
    ),
]


class Ctx:
    """What the steps share: arguments, report, torch, the device and CUDA asked directly."""

    def __init__(self, args: argparse.Namespace, report: Report) -> None:
        self.args, self.dry, self.report, self._runtime = args, args.dry_run, report, None

    @property
    def torch(self) -> Any:
        import torch  # at first use: step 1 runs without it

        return torch

    @property
    def device(self) -> Any:
        return self.torch.device("cpu" if self.dry else "cuda")

    @property
    def runtime(self) -> Any:
        if self._runtime is None:
            from .cuda import DriverDouble, Runtime

            self._runtime = DriverDouble(os.environ["HOSTREG_CUDA_LIBRARY"]) if self.dry else Runtime(self.torch)
            self.log(f"CUDA asked directly: {self._runtime.describe}")
        return self._runtime

    def sync(self) -> None:
        if not self.dry:
            self.torch.cuda.synchronize()

    def log(self, msg: str) -> None:
        self.report.log(msg)


def model_names() -> list[str]:
    """The shapes of hostreg.cli.models, read from the source (hostreg/cli/shapes.py, which imports
    nothing of the package and no torch): arguments are checked before the build."""
    spec = importlib.util.spec_from_file_location("_hostreg_shapes", REPO / "python" / "hostreg" / "cli" / "shapes.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sorted(module.MODELS)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description="Verify hostreg's cuda backend on an NVIDIA GPU.")
    p.add_argument("--dry-run", action="store_true", help="no GPU: the CUDA driver test double, CPU tensors")
    p.add_argument("--steps", default="1,2,3,4,5", help="comma-separated steps to run (default: all)")
    p.add_argument("--log-dir", type=Path, help="where check.log, results.json, table.txt go (default $OUT/gpu_check)")
    p.add_argument("--build-status", choices=["PASS", "FAIL", "INFO"], help="result of the build (from gpu_check.sh)")
    p.add_argument("--build-detail", default="", help="key figure of the build row (from gpu_check.sh)")
    p.add_argument("--expect-package", help="directory hostreg must be imported from (the fresh build)")
    p.add_argument("--size-mib", type=int, help="MiB of the single-tensor D2H test (default 1024; dry run 4)")
    p.add_argument("--model", choices=model_names(), help="GPT-2 shape for step 5 (default gpt2-xl; dry run tiny)")
    p.add_argument("--repeats", type=int, default=5, help="timed copies per measurement, median taken (>= 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed copies before timing (default 2)")
    p.add_argument("--check-args", action="store_true", help="only validate the arguments")
    a = p.parse_args(argv)
    a.steps = [s.strip() for s in a.steps.split(",") if s.strip()]
    if not a.steps or any(s not in [n for n, *_ in STEPS] for s in a.steps):
        p.error(f"--steps takes a comma-separated subset of 1,2,3,4,5, got {','.join(a.steps)!r}")
    if a.repeats < 5 or a.warmup < 0:
        p.error("--repeats must be >= 5 (median of at least 5) and --warmup >= 0")
    if a.size_mib is None:
        a.size_mib = 4 if a.dry_run else 1024
    if a.size_mib <= 0:
        p.error("--size-mib must be > 0")
    a.model = a.model or ("tiny" if a.dry_run else "gpt2-xl")
    out = os.environ.get("OUT")
    a.log_dir = a.log_dir or (Path(out) / "gpu_check" if out else REPO / "build" / "gpu" / "logs")
    return a


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    if a.check_args:
        return 0
    os.environ.setdefault("HOSTREG_BACKEND", "cuda")
    if a.dry_run and not os.environ.get("HOSTREG_CUDA_LIBRARY"):
        raise SystemExit(
            "gpu_check --dry-run: set HOSTREG_CUDA_LIBRARY to the CUDA driver test double (gpu_check.sh does)"
        )
    report = Report(a.log_dir)
    report.say(
        f"gpu_check: {'DRY RUN (no GPU: CUDA driver test double, CPU tensors)' if a.dry_run else 'GPU run'}; logs in {a.log_dir}"
    )
    ctx, stop = Ctx(a, report), ""
    for number, specs, run, needs_build in STEPS:
        if number not in a.steps:
            continue
        size = f"{a.size_mib / 1024:g} GiB" if a.size_mib >= 1024 else f"{a.size_mib} MiB"
        rows = {rid: Row(rid, check.replace("SIZE", size).replace("MODEL", a.model)) for rid, check in specs}
        report.rows.extend(rows.values())
        skip = stop or ("build failed" if needs_build and a.build_status == "FAIL" else "")
        if skip:
            for r in rows.values():
                r.result, r.figure = "SKIP", f"not run: {skip}"
            continue
        report.say(f"step {number} ...")
        t0 = time.perf_counter()
        try:
            if needs_build:
                ctx.torch  # noqa: B018 (torch first, then hostreg.torch, as applications do)
            run(ctx, rows)
        except BaseException as e:  # a failing step must not hide the others; SIGINT: the time limit
            report.log(f"step {number} raised:\n{traceback.format_exc()}")
            stop = "time limit" if isinstance(e, KeyboardInterrupt) else ""
            if not isinstance(e, Exception) and not stop:
                raise
            for r in rows.values():
                if r.figure == "not reported":
                    r.result, r.figure = (
                        "FAIL",
                        (
                            "interrupted (time limit)"
                            if stop
                            else f"error: {type(e).__name__}: {e}".replace("\n", " ")[:160]
                        ),
                    )
        gc.collect()
        report.log(f"step {number} took {time.perf_counter() - t0:.1f} s")
    table = report.close()
    print(f"\n{table}", flush=True)
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
