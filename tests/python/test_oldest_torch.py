"""Checkpoints outlive the tool that wrote them, down to the oldest torch hostreg claims
(2.4.0): what hostreg's FileSystemWriter writes, torch 2.4's own ``dcp.load`` and
``format_utils.dcp_to_torch_save`` read bit-exact, and what torch 2.4's own
``FileSystemWriter`` wrote, hostreg's FileSystemReader reads bit-exact.

torch 2.4.0 runs as PyPI's aarch64 CPU build under qemu-user (``scripts/oldest-torch`` says
why and how; PyPI's x86_64 2.4.0 is a CUDA build of several GB). Skipped where it cannot be
had, except under CI (``CI`` set), whose setup provides it: there its absence fails. A run
of torch 2.4 under emulation takes about 25 s, most of it ``import torch``: the test makes one.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp
from support import oldest_torch_sd as oldest  # the same builder both torches run

import hostreg.torch as ht

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "oldest_torch_sd.py"


def test_checkpoints_cross_between_hostreg_and_torch_2_4(tmp_path: Path) -> None:
    """One run of torch 2.4.0 (its start under emulation is most of the cost): it loads and
    converts what hostreg's writer wrote, and saves a checkpoint of its own, which hostreg's
    reader then loads."""
    got = subprocess.run([str(REPO / "scripts" / "oldest-torch")], capture_output=True, text=True, timeout=900)
    if got.returncode != 0 or not got.stdout.strip():
        if os.environ.get("CI"):
            pytest.fail(f"torch 2.4.0 under qemu-aarch64 is missing: CI sets it up (scripts/setup): {got.stderr}")
        pytest.skip(f"torch 2.4.0 under qemu-aarch64 is not to be had here: {got.stderr.strip()}")
    torch24 = shlex.split(got.stdout)

    sd = oldest.build(1)
    ours = tmp_path / "by-hostreg"
    w = ht.FileSystemWriter(ours)
    dcp.save(sd, storage_writer=w, no_dist=True)
    assert w.stats.requests > 0  # hostreg's engine wrote it
    theirs = tmp_path / "by-torch-2.4"

    run = subprocess.run(
        [*torch24, str(SCRIPT), "load", str(ours), "1", str(tmp_path / "by-hostreg.pt"), "save", str(theirs), "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"torch 2.4 failed ({run.returncode}):\n{run.stderr[-3000:]}"
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["torch"] == "2.4.0", out["torch"]

    # torch 2.4's own dcp.load and dcp_to_torch_save read hostreg's checkpoint bit-exact
    want = oldest.digest(sd)
    assert out["loaded"] == want
    assert out["converted"] == want

    # hostreg's reader reads torch 2.4's own checkpoint bit-exact
    dest = oldest.empty_like(oldest.build(2))
    r = ht.FileSystemReader(theirs)
    dcp.load(dest, storage_reader=r, no_dist=True)
    assert oldest.digest(dest) == out["saved"]
    assert r.stats.requests > 0  # hostreg's engine read the tensors, not DCP's fallback alone
    assert out["saved"] == oldest.digest(oldest.build(2))  # torch's generator agrees across the two
