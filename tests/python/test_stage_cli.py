"""`hostreg stage`, the main job, run as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import low_memlock
from conftest import table_row as row

HOSTREG = str(Path(sys.executable).parent / "hostreg")  # the console script


def stage(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, HOSTREG, "stage", *args], capture_output=True, text=True, timeout=600, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    )


def test_default_model_stages_and_verifies():
    r = stage()
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "backend") == "posix"
    assert row(r.stdout, "tensors (registered)") == "148 (148)"
    staged = int(row(r.stdout, "bytes staged").split()[0].replace(",", ""))
    locked = int(row(r.stdout, "bytes locked (VmLck rise)").split()[0].replace(",", ""))
    assert staged == 124_439_808 * 4  # GPT-2 small: 124.4 M fp32 parameters
    assert locked >= staged
    assert row(r.stdout, "values verified") == "yes"
    assert row(r.stdout, "unregistered on release") == "yes"


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_checkpoint_files(tmp_path: Path, suffix: str):
    sd = {"a": torch.randn(100, 3), "b": torch.arange(7, dtype=torch.int64), "c": torch.ones(2, dtype=torch.bfloat16)}
    path = tmp_path / f"ckpt{suffix}"
    if suffix == ".pt":
        torch.save(sd, path)
    else:
        from safetensors.torch import save_file

        save_file(sd, str(path))
    r = stage("--checkpoint", str(path))
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "tensors (registered)") == "3 (3)"
    assert row(r.stdout, "bytes staged").startswith("1,260 ")  # 1200 + 56 + 4


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.pt", None, "does not exist"),
        ("weights.npz", b"x", "unknown format '.npz'"),
        ("empty.pt", "empty", "holds no state dict of tensors"),
    ],
)
def test_bad_checkpoints_fail_clearly(tmp_path: Path, name, content, message):
    path = tmp_path / name
    if content == "empty":
        torch.save({"x": 1}, path)
    elif content is not None:
        path.write_bytes(content)
    r = stage("--checkpoint", str(path))
    assert r.returncode == 1
    assert message in r.stderr and "staging failed" in r.stderr


def test_memlock_limit_fails_with_the_reason():
    # A container's default: RLIMIT_MEMLOCK 8192 KiB and no CAP_IPC_LOCK.
    r = stage(prefix=low_memlock(8192))
    assert r.returncode == 1
    assert "RLIMIT_MEMLOCK (8192 KiB" in r.stderr and "cudaErrorMemoryAllocation (2)" in r.stderr


def test_usage_errors_exit_2():
    r = stage("--model", "nope")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_corrupt_checkpoints_fail_without_a_traceback(tmp_path: Path):
    (tmp_path / "corrupt.pt").write_bytes(b"PK\x03\x04 not really a zip")
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
    for name in ("corrupt.pt", "bad.safetensors"):
        r = stage("--checkpoint", str(tmp_path / name))
        assert r.returncode == 1
        assert f"cannot read checkpoint {tmp_path / name}" in r.stderr and "Traceback" not in r.stderr


def test_module_checkpoint_is_refused_with_advice(tmp_path: Path):
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")
    r = stage("--checkpoint", str(tmp_path / "module.pt"))
    assert r.returncode == 1 and "save its state_dict()" in r.stderr


def test_nan_values_verify(tmp_path: Path):
    torch.save({"x": torch.tensor([1.0, float("nan"), 3.0])}, tmp_path / "nan.pt")
    r = stage("--checkpoint", str(tmp_path / "nan.pt"))
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "values verified") == "yes"


def test_torch_engine_accepts_0d_tensors(tmp_path: Path):
    # PyTorch's path leaves 0-d tensors plain (not shared, not pinned): that is not a failure.
    torch.save({"w": torch.randn(10), "num_batches_tracked": torch.tensor(3)}, tmp_path / "bn.pt")
    r = stage("--checkpoint", str(tmp_path / "bn.pt"), "--engine", "torch")
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "tensors (registered)") == "2 (1)"
    r = stage("--checkpoint", str(tmp_path / "bn.pt"))
    assert r.returncode == 0 and row(r.stdout, "tensors (registered)") == "2 (2)"


def test_unusual_tensors_fail_or_verify_without_a_traceback(tmp_path: Path):
    torch.save({"c": torch.randn(3, dtype=torch.complex64).conj()}, tmp_path / "conj.pt")
    r = stage("--checkpoint", str(tmp_path / "conj.pt"))
    assert r.returncode == 0, r.stderr
    torch.save({"s": torch.eye(3).to_sparse()}, tmp_path / "sparse.pt")
    r = stage("--checkpoint", str(tmp_path / "sparse.pt"))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "strided tensors" in r.stderr
