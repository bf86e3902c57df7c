"""scripts/gpu_check.sh / gpu_check.py without a GPU: the dry run prints a row for
every check in the table format the GPU run uses, the targets' arithmetic fails when it
should, the differential test reports every difference, and arguments are validated.

The dry run replaces libcuda with the CUDA driver test double, the CUDA runtime side of the
differential test with the expected-code table, CUDA tensors with CPU tensors and the CUDA
event timer with a fake one (docs/gpu-check.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import hostreg
from conftest import REPO

SCRIPT_SH = REPO / "scripts/gpu_check.sh"
SCRIPT_PY = REPO / "scripts/gpu_check.py"
DOUBLES = Path(os.environ.get("HOSTREG_DOUBLES_DIR", REPO / "build/cpp/tests/doubles"))
ALL_ROWS = ["1a", "1b", "2", "3", "4a", "4b", "4c", "4d", "5a", "5b", "5c", "5d", "5e", "5f"]
ROW = re.compile(r"^(\S+)\s{2,}(.+?)\s{2,}(PASS|FAIL|INFO|SKIP)(?:\s{2,}(.*))?$")


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), **extra}
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


def test_dry_run_has_every_step(tmp_path: Path):
    r = run([str(SCRIPT_SH), "--dry-run", "--no-build", "--build-dir", str(tmp_path / "build")], env_for(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    rows, overall = table(r.stdout)
    assert list(rows) == ALL_ROWS
    results = {k: v[1] for k, v in rows.items()}
    # 1a: no build asked for; 5e: a measurement without a target. Everything else passes.
    assert results == {k: ("INFO" if k in ("1a", "5e") else "PASS") for k in ALL_ROWS}
    assert overall == "overall: PASS (14/14 rows PASS or INFO)"
    assert "DRY RUN" in r.stdout
    assert re.match(r"\d+/\d+ codes equal to the expected table", rows["2"][2])
    assert "target >= 0.95x" in rows["5a"][2] and "target >= 3x" in rows["5b"][2] and "target >= 3x" in rows["5f"][2]
    assert rows["5c"][0] == "D2H tiny: hostreg vs pin_memory" and rows["5a"][0] == "D2H 4 MiB: hostreg vs pin_memory"

    logs = tmp_path / "out/gpu_check"  # $OUT/gpu_check
    assert (logs / "table.txt").read_text().strip() == r.stdout[r.stdout.index("step  check") :].strip()
    results_json = json.loads((logs / "results.json").read_text())
    assert results_json["ok"] and [row["id"] for row in results_json["rows"]] == ALL_ROWS
    assert len(results_json["details"]["conformance"]) > 40
    log = (logs / "check.log").read_text()
    assert "differential conformance" in log and "D2H hostreg" in log
    assert (logs / "stdout.log").read_text() == r.stdout


def test_dry_run_through_the_cmake_build(tmp_path: Path):
    build = tmp_path / "build"
    r = run([str(SCRIPT_SH), "--dry-run", "--build-dir", str(build), "--steps", "1,2,3"], env_for(tmp_path), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr + (tmp_path / "out/gpu_check/build.log").read_text()
    rows, _ = table(r.stdout)
    assert list(rows) == ["1a", "1b", "2", "3"]
    assert rows["1a"][1] == "PASS" and str(build / "py/hostreg") in rows["1a"][2]
    # The package gpu_check.py imported is the fresh build, and it works without `rich`.
    assert rows["1b"][1] == "PASS" and str(build / "py/hostreg") in rows["1b"][2]
    assert rows["2"][1] == rows["3"][1] == "PASS"
    assert any((build / "py/hostreg").glob("_hostreg*.so")) and (build / "py/hostreg/torch.py").is_file()


def test_missed_target_fails(tmp_path: Path):
    env = env_for(tmp_path, HOSTREG_BACKEND="cuda")
    r = run([sys.executable, str(SCRIPT_PY), "--dry-run", "--steps", "5", "--fake-gbps", "hostreg=20", "--log-dir", str(tmp_path)], env)
    assert r.returncode == 1, r.stdout + r.stderr
    rows, overall = table(r.stdout)
    assert {k: v[1] for k, v in rows.items()} == {"5a": "FAIL", "5b": "FAIL", "5c": "FAIL", "5d": "FAIL", "5e": "INFO", "5f": "PASS"}
    assert rows["5a"][2].startswith("0.39x (hostreg 20.0 vs pin_memory 51.0 GB/s)")
    assert overall.startswith("overall: FAIL")


def test_failed_build_skips_the_rest(tmp_path: Path):
    r = run([sys.executable, str(SCRIPT_PY), "--dry-run", "--build-status", "FAIL", "--build-detail", "build failed: x", "--log-dir", str(tmp_path)], env_for(tmp_path))
    assert r.returncode == 1
    rows, _ = table(r.stdout)
    assert rows["1a"] == ("build (cmake Release, nanobind extension)", "FAIL", "build failed: x")
    assert all(rows[k][1:] == ("SKIP", "not run: build failed") for k in ALL_ROWS[2:])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--dry-run", "--repeats", "3"], "--repeats must be >= 5"),
        (["--dry-run", "--steps", "2,7"], "--steps takes a comma-separated subset of 1,2,3,4,5"),
        (["--fake-gbps", "hostreg=1"], "--fake-gbps is for --dry-run only"),
        (["--dry-run", "--fake-gbps", "nvme=1"], "kind must be one of"),
        (["--dry-run", "--model", "gpt5"], "--model must be one of"),
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
    r = run([sys.executable, str(SCRIPT_PY), "--help"], env_for(tmp_path), timeout=60)
    assert r.returncode == 0 and "--fake-gbps" in r.stdout


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT_PY)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_differential_reports_every_difference():
    # The GPU run's two-sided comparison, here with hostreg (this process's backend) on both
    # sides and a reference whose cudaHostUnregister(NULL) answers 1: exactly that call
    # differs. Every case cleans up (the autouse fixture checks registrations and VmLck).
    g = load_gpu_check()
    ref = g.Side("runtime", hostreg.host_register, lambda p: 1 if p == 0 else hostreg.host_unregister(p))
    ours = g.Side("hostreg", hostreg.host_register, hostreg.host_unregister)
    assert g.run_cases([ref, ours]) == []
    c = g.compare(ref.codes, "runtime", ours.codes, none_is_undecided=False)
    assert c.checked == len(ours.codes) > 40 and c.undecided == 0
    assert len(c.diffs) == 1 and "unregister NULL" in c.diffs[0]
    assert "runtime=cudaErrorInvalidValue (1)" in c.diffs[0] and "hostreg=cudaErrorHostMemoryNotRegistered (713)" in c.diffs[0]
    # A call only one side made is a difference too.
    c = g.compare({("a", "x"): 0}, "runtime", {("a", "x"): 0, ("a", "y"): 0}, none_is_undecided=False)
    assert len(c.diffs) == 1 and "runtime=-" in c.diffs[0]
    # Dry run: None in the expected table means "the driver decides": not checked.
    c = g.compare({("a", "x"): None, ("a", "y"): 1}, "expected", {("a", "x"): 801, ("a", "y"): 1}, none_is_undecided=True)
    assert (c.checked, c.undecided, c.diffs) == (1, 1, [])
