"""The examples in examples/ run as their docstrings say, and do what they claim.

- ``fsdp2_checkpoint.py``: two ranks on the CPU (gloo) under ``torchrun``; the first run
  checkpoints asynchronously after step 3 and dies at step 5, the second resumes and must end
  bit-identical to an unbroken run (the example itself compares, and also the state it loaded
  with the unbroken run's at step 3, so a load that did nothing cannot pass).
- ``load_pinned.py``: weights loaded into hostreg's pinned arena equal the saved ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def test_fsdp2_checkpoint_is_killed_and_resumes_bit_identically(tmp_path: Path):
    example = str(REPO / "examples" / "fsdp2_checkpoint.py")
    ckpt = str(tmp_path / "ckpt")
    killed = subprocess.run([*TORCHRUN, example, ckpt, "--crash-at", "5"], capture_output=True, text=True, timeout=300)
    assert killed.returncode != 0, killed.stdout + killed.stderr  # torchrun reports the ranks' deaths
    assert "rank 0: killed during step 5" in killed.stdout and "rank 1: killed during step 5" in killed.stdout
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"], files
    resumed = subprocess.run([*TORCHRUN, example, ckpt, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed from step 3: bit-identical to an unbroken run: True" in resumed.stdout


def test_load_pinned_loads_the_saved_weights_into_pinned_memory():
    r = subprocess.run(
        [sys.executable, str(REPO / "examples" / "load_pinned.py")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pinned by hostreg: True" in r.stdout and "weights equal the saved ones: True" in r.stdout
