"""scripts/gpu_check.sh and the gpu_check package (scripts/gpu_check/) without a GPU: the
dry run prints a row for every check in the table format the GPU run uses, the differential
step reports every difference, the targets' arithmetic fails when it should, and arguments
are validated.

The dry run loads the CUDA driver test double instead of libcuda (for hostreg's cuda backend
and as the "runtime" the differential step asks) and uses CPU tensors; its step 5 rows are
INFO (docs/gpu-check.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from support import bad_inputs

SCRIPT_SH = REPO / "scripts/gpu_check.sh"
SCRIPTS = REPO / "scripts"  # the gpu_check package lives here
DOUBLES = Path(os.environ.get("HOSTREG_DOUBLES_DIR", REPO / "build/cpp/tests/doubles"))
ALL_ROWS = ["1a", "1b", "2", "3", "4a", "4b", "4c", "4d", "5a", "5b", "5c", "5d", "5e", "5f"]
ROW = re.compile(r"^(\S+)\s{2,}(.+?)\s{2,}(PASS|FAIL|INFO|SKIP)(?:\s{2,}(.*))?$")


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    # SCRIPTS before the suite's own (conftest's CHILD_SITE, which gc-freezes torch's import).
    path = os.pathsep.join(p for p in (str(SCRIPTS), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "PYTHONPATH": path, **extra}
    env.pop("HOSTREG_BACKEND", None)
    env.pop("HOSTREG_AUTO_INSTALL", None)
    double = DOUBLES / "libhostreg_double_cuda.so"
    if double.is_file():  # else gpu_check.sh compiles the double into its build dir
        env["HOSTREG_CUDA_LIBRARY"] = str(double)
    return env


def run(cmd: list[str], env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def table(stdout: str) -> tuple[dict[str, tuple[str, str, str]], str]:
    """({row id: (check, result, figure)}, overall line) of the table that ends stdout."""
    lines = stdout.rstrip("\n").splitlines()
    assert lines[-1].startswith("overall: "), f"stdout does not end with the table:\n{stdout}"
    header = max(i for i, line in enumerate(lines) if line.startswith("step  check"))
    assert set(lines[header + 1]) <= {"-", " "}
    rows = {}
    for line in lines[header + 2 : -2]:
        m = ROW.match(line)
        assert m, f"not a table row: {line!r}"
        rows[m.group(1)] = (m.group(2), m.group(3), m.group(4) or "")
    assert lines[-2] == ""
    return rows, lines[-1]


# The CUDA driver double answers 2 (its mlock fails) where hostreg refuses memory that is not
# mapped with 1 before any runtime sees it; the real runtime decides on a GPU.
DOUBLE_DIFFERS = ["huge-bytes", "wild-pointer", "freed-memory", "partly-unmapped"]


def test_dry_run_has_every_step(tmp_path: Path):
    r = run([str(SCRIPT_SH), "--dry-run", "--no-build", "--build-dir", str(tmp_path / "build")], env_for(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    rows, overall = table(r.stdout)
    assert list(rows) == ALL_ROWS
    results = {k: v[1] for k, v in rows.items()}
    # 1a: no build asked for; 2: a double is no reference; 5: CPU copies. The rest passes.
    info = {"1a", "2", "5a", "5b", "5c", "5d", "5e", "5f"}
    assert results == {k: ("INFO" if k in info else "PASS") for k in ALL_ROWS}
    assert overall == "overall: PASS (14/14 rows PASS or INFO)"
    assert "DRY RUN" in r.stdout
    n = len(bad_inputs.CASES)
    assert rows["2"][2] == (
        f"{n - len(DOUBLE_DIFFERS)}/{n} answers equal to the CUDA driver double; differ: "
        f"{', '.join(DOUBLE_DIFFERS)} (dry run: the real runtime decides)"
    )
    assert "target >= 0.95x" in rows["5a"][2] and "target >= 3x" in rows["5b"][2] and "target >= 3x" in rows["5f"][2]
    assert rows["5c"][0] == "D2H tiny: hostreg vs pin_memory" and rows["5a"][0] == "D2H 4 MiB: hostreg vs pin_memory"

    logs = tmp_path / "out/gpu_check"  # $OUT/gpu_check
    assert (logs / "table.txt").read_text().strip() == r.stdout[r.stdout.index("step  check") :].strip()
    results_json = json.loads((logs / "results.json").read_text())
    assert results_json["ok"] and [row["id"] for row in results_json["rows"]] == ALL_ROWS
    assert len(results_json["details"]["differential"]) == n
    log = (logs / "check.log").read_text()
    assert "differential cases" in log and "D2H GB/s" in log
    assert (logs / "stdout.log").read_text() == r.stdout


def test_dry_run_through_the_cmake_build(tmp_path: Path):
    # A fresh build tree inside the repository's build/ (removed after): scripts/test's ccache
    # then finds its objects again from run to run, since the sources' paths relative to the
    # tree are the same whatever the tree's name.
    build = REPO / "build" / f"gpu-dry-test-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    try:
        _dry_run_through_the_cmake_build(tmp_path, build)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _dry_run_through_the_cmake_build(tmp_path: Path, build: Path) -> None:
    r = run(
        [str(SCRIPT_SH), "--dry-run", "--build-dir", str(build), "--steps", "1,2,3"], env_for(tmp_path), timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr + (tmp_path / "out/gpu_check/build.log").read_text()
    rows, _ = table(r.stdout)
    assert list(rows) == ["1a", "1b", "2", "3"]
    pkg = build / "py/hostreg"
    shown = str(pkg.relative_to(REPO))  # the report names paths inside the repository relative to it
    assert rows["1a"][1] == "PASS" and shown in rows["1a"][2]
    # The package the check imported is the fresh build (`cmake --install`), working without rich.
    assert rows["1b"][1] == "PASS" and shown in rows["1b"][2]
    assert (rows["2"][1], rows["3"][1]) == ("INFO", "PASS")
    assert (
        any(pkg.glob("_hostreg*.so")) and any(pkg.glob("libhostreg.so*")) and (pkg / "torch" / "__init__.py").is_file()
    )


def test_a_differing_answer_fails_the_differential_step(tmp_path: Path):
    # The GPU run's comparison with a "runtime" (hostreg itself, in a process whose backend is
    # cuda over the driver double) that answers cudaHostUnregister(NULL) with 1.
    code = f"""
import sys; sys.path.insert(0, {str(SCRIPTS)!r})
import hostreg
from pathlib import Path
from gpu_check.checks import step_differential
from gpu_check.report import Report, Row
class Runtime:
    path = "libcudart.so.13"
    register = staticmethod(hostreg.host_register)
    @staticmethod
    def unregister(p):
        return 1 if p == 0 else hostreg.host_unregister(p)
class Ctx:
    dry, runtime, report = False, Runtime(), Report(Path({str(tmp_path)!r}))
    log = staticmethod(lambda msg: None)
rows = {{"2": Row("2", "differential")}}
step_differential(Ctx(), rows)
print(rows["2"].result, rows["2"].figure, hostreg.stats().registrations)
"""
    env = env_for(tmp_path, HOSTREG_BACKEND="cuda")
    if "HOSTREG_CUDA_LIBRARY" not in env:
        pytest.skip("the CUDA driver double is not built (build/cpp/tests/doubles)")
    r = run([sys.executable, "-c", code], env)
    assert r.returncode == 0, r.stderr
    assert (
        r.stdout.splitlines()[-1]
        == f"FAIL unregister-null: runtime 1, hostreg 713; 1 of {len(bad_inputs.CASES)} answers differ 0"
    )


def test_a_missed_target_fails():
    sys.path.insert(0, str(SCRIPTS))
    from gpu_check.d2h import judge
    from gpu_check.report import Row

    class Gpu:
        dry = False

    row = Row("5a", "D2H")
    judge(row, Gpu(), {"hostreg": 20.0, "pin_memory": 51.0, "hostreg pinned": True}, "pin_memory", 0.95)
    assert (row.result, row.figure) == ("FAIL", "0.39x (hostreg 20.0 vs pin_memory 51.0 GB/s), target >= 0.95x")
    judge(row, Gpu(), {"hostreg": 52.0, "pin_memory": 51.0, "hostreg pinned": False}, "pin_memory", 0.95)
    assert row.result == "FAIL" and row.figure.endswith("; staged memory not pinned")
    judge(row, Gpu(), {"hostreg": 52.0, "pin_memory": 51.0, "hostreg pinned": True}, "pin_memory", 0.95)
    assert row.result == "PASS"


def test_failed_build_skips_the_rest(tmp_path: Path):
    cmd = [
        sys.executable,
        "-m",
        "gpu_check",
        "--dry-run",
        "--build-status",
        "FAIL",
        "--build-detail",
        "build failed: x",
        "--log-dir",
        str(tmp_path),
    ]
    r = run(cmd, env_for(tmp_path))
    assert r.returncode == 1, r.stdout + r.stderr
    rows, _ = table(r.stdout)
    assert rows["1a"] == ("build (cmake Release, nanobind extension)", "FAIL", "build failed: x")
    assert all(rows[k][1:] == ("SKIP", "not run: build failed") for k in ALL_ROWS[2:])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--dry-run", "--repeats", "3"], "--repeats must be >= 5"),
        (["--dry-run", "--steps", "2,7"], "--steps takes a comma-separated subset of 1,2,3,4,5"),
        (["--dry-run", "--model", "gpt5"], "argument --model: invalid choice: 'gpt5'"),
        (["--dry-run", "--size-mib", "0"], "--size-mib must be > 0"),
        (["--build-dir"], "--build-dir needs a directory"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path, args: list[str], message: str):
    r = run([str(SCRIPT_SH), *args], env_for(tmp_path), timeout=60)
    assert r.returncode == 2 and message in r.stderr, r.stdout + r.stderr
    assert "step  check" not in r.stdout and not (tmp_path / "out").exists()


def test_help(tmp_path: Path):
    r = run([str(SCRIPT_SH), "--help"], env_for(tmp_path), timeout=60)
    assert r.returncode == 0 and "--dry-run" in r.stdout and "--no-build" in r.stdout
    r = run([sys.executable, "-m", "gpu_check", "--help"], env_for(tmp_path), timeout=60)
    assert r.returncode == 0 and "--dry-run" in r.stdout and "--model" in r.stdout


def test_the_package_stays_small():
    # Under 900 lines, no file over 300: it borrows cases, flags, codes, shapes and timings.
    sizes = {f.name: len(f.read_text().splitlines()) for f in (SCRIPTS / "gpu_check").glob("*.py")}
    assert sum(sizes.values()) < 900 and max(sizes.values()) <= 300, sizes
