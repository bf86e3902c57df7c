"""``scripts/upstream-dcp``: PyTorch's own DCP tests, run with DCP's classes and with hostreg's
swapped in (``tests/upstream/hook``).

The upstream files are not in this repository (see tests/upstream/README.md): with
``HOSTREG_UPSTREAM_PYTORCH`` set to a PyTorch checkout, ``test_pytorch_dcp_tests_pass_swapped``
runs them. The other tests check the runner itself, on small test files written here in the
upstream layout: that it passes a drop-in and proves hostreg's classes did the I/O, and that it
fails a test that passes only with DCP's classes, and a swap that was not in effect.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

RUNNER = [sys.executable, str(REPO / "scripts" / "upstream-dcp"), "--python", sys.executable]

# Written in the layout of torch's tests: the names imported from DCP at module import, a save
# through checkpoint_id= (DCP's _storage_utils builds the writer), a load through the class.
DROP_IN = """
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter


def test_checkpoint_id_round_trip(tmp_path):
    sd = {"w": torch.arange(1000.0), "b": torch.ones(3, dtype=torch.int8)}
    dcp.save(sd, checkpoint_id=str(tmp_path))
    back = {"w": torch.zeros(1000), "b": torch.zeros(3, dtype=torch.int8)}
    dcp.load(back, storage_reader=FileSystemReader(str(tmp_path)))
    assert torch.equal(back["w"], sd["w"]) and torch.equal(back["b"], sd["b"])


def test_torchs_own_subclasses_stay_dcps():
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter

    assert HuggingFaceStorageWriter.__mro__[1].__module__ == "torch.distributed.checkpoint.filesystem"


def test_writer_by_class(tmp_path):
    sd = {"x": torch.randn(64, 64)}
    dcp.save(sd, storage_writer=FileSystemWriter(str(tmp_path), single_file_per_rank=False))
    back = {"x": torch.zeros(64, 64)}
    dcp.load(back, checkpoint_id=str(tmp_path))
    assert torch.equal(back["x"], sd["x"])
"""

# Passes only with DCP's classes, and saves through DCP's class whatever is swapped.
NOT_DROP_IN = """
import atexit
import os
import signal
import unittest

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter

SWAPPED = FileSystemWriter.__module__.startswith("hostreg")


def test_needs_dcps_own_class():
    assert not SWAPPED


def test_bypasses_the_swap(tmp_path):
    from hostreg.torch._checkpoint.writer import _StockWriter  # DCP's class, as hostreg imported it
    dcp.save({"x": torch.ones(4)}, storage_writer=_StockWriter(str(tmp_path)))


def test_mixes_the_swapped_class_with_dcps(tmp_path):
    dcp.save({"x": torch.ones(4)}, checkpoint_id=str(tmp_path / "a"))  # the swapped class
    from hostreg.torch._checkpoint.writer import _StockWriter
    dcp.save({"x": torch.ones(4)}, storage_writer=_StockWriter(str(tmp_path / "b")))


class TestSubtests(unittest.TestCase):
    def test_a_subtest_skipped_only_swapped(self):
        for fmt in ("a", "b"):
            with self.subTest(fmt=fmt):
                if SWAPPED and fmt == "b":
                    self.skipTest("only swapped")


def test_crashes_at_exit_only_swapped():
    if SWAPPED:
        atexit.register(lambda: os.kill(os.getpid(), signal.SIGSEGV))
"""


def _tree(root: Path, files: dict[str, str]) -> Path:
    folder = root / "pytorch" / "test" / "distributed" / "checkpoint"
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return root / "pytorch"


def test_runner_passes_a_drop_in_and_proves_hostregs_classes_did_the_io(tmp_path: Path):
    tree = _tree(tmp_path, {"test_mini.py": DROP_IN})
    out = tmp_path / "report.json"
    r = subprocess.run(
        [*RUNNER, str(tree), "--files", "test_mini.py", "--runs", "stock,all", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: every test that passed with DCP's classes passed" in r.stdout
    report = json.loads(out.read_text())["test_mini.py"]
    node = "test/distributed/checkpoint/test_mini.py::test_checkpoint_id_round_trip"
    for run in ("stock", "all"):
        assert report[run]["outcomes"] == {
            node: "passed",
            node.replace("test_checkpoint_id_round_trip", "test_writer_by_class"): "passed",
            node.replace("test_checkpoint_id_round_trip", "test_torchs_own_subclasses_stay_dcps"): "passed",
        }
    assert report["stock"]["io"][node] == {
        "dcp-writer": 1,
        "dcp-reader": 1,
        "dcp-save-planner": 1,
        "dcp-load-planner": 1,
    }
    every = report["all"]["io"][node]
    assert every["hostreg-save-planner"] == 1 and every["hostreg-load-planner"] == 1
    assert every["hostreg-writer"] == 1 and every["hostreg-reader"] == 1 and every["hostreg-reader-file"] == 1
    assert not [label for label in every if label.startswith("dcp-")], every


def test_runner_fails_a_test_lost_in_the_swap_and_a_swap_not_in_effect(tmp_path: Path):
    tree = _tree(tmp_path, {"test_not_drop_in.py": NOT_DROP_IN})
    r = subprocess.run(
        [*RUNNER, str(tree), "--files", "test_not_drop_in.py", "--runs", "stock,writer"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1, r.stdout + r.stderr
    node = "test/distributed/checkpoint/test_not_drop_in.py::"
    for says in (
        f"writer: {node}test_needs_dcps_own_class passed stock, failed swapped",
        f"writer: {node}test_bypasses_the_swap: dcp-writer in the stock run, no hostreg-writer or hostreg-writer-stock here",
        f"writer: {node}test_mixes_the_swapped_class_with_dcps: dcp-writer in a run that swaps the writer",
        f"writer: {node}TestSubtests::test_a_subtest_skipped_only_swapped passed stock, skipped swapped",
        "writer: test_not_drop_in.py: pytest exited with status -11 (stock: 0)",
    ):
        assert says in r.stdout, says + "\n" + r.stdout
    assert r.stdout.count(" passed stock, ") == 2, r.stdout


def test_the_hook_says_when_it_could_not_swap(tmp_path: Path):
    # Python only warns when sitecustomize raises: the hook leaves its error where the runner
    # looks, and the runner fails the run (a run with nothing swapped must not pass).
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO / "tests" / "upstream" / "hook"),
        HOSTREG_DCP_SWAP="writer,bogus",
        HOSTREG_DCP_SWAP_LOG=str(tmp_path),
    )
    r = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=120)
    (marker,) = tmp_path.glob("*.hook")
    assert marker.read_text().startswith("error: ") and "unknown part(s) ['bogus']" in marker.read_text()
    env["HOSTREG_DCP_SWAP"] = "writer"
    subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True, timeout=120)
    assert sorted(m.read_text()[:6] for m in tmp_path.glob("*.hook")) == ["error:", "ok\n"], r.stderr


def test_runner_refuses_a_folder_without_the_tests(tmp_path: Path):
    r = subprocess.run([*RUNNER, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "a PyTorch checkout is needed" in r.stderr


@pytest.mark.skipif(
    not os.environ.get("HOSTREG_UPSTREAM_PYTORCH"),
    reason="HOSTREG_UPSTREAM_PYTORCH is not set to a PyTorch checkout (tests/upstream/README.md)",
)
def test_pytorch_dcp_tests_pass_swapped():
    r = subprocess.run(
        [*RUNNER, os.environ["HOSTREG_UPSTREAM_PYTORCH"]], capture_output=True, text=True, timeout=3 * 3600
    )
    assert r.returncode == 0, r.stdout[-20000:] + r.stderr[-5000:]
