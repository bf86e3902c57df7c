"""Checkpoints outlive the tool that wrote them, down to the oldest torch hostreg claims
(2.4.0): what hostreg's FileSystemWriter writes, torch 2.4's own ``dcp.load`` and
``format_utils.dcp_to_torch_save`` read bit-exact, and what torch 2.4's own
``FileSystemWriter`` wrote, hostreg's FileSystemReader reads bit-exact.

torch 2.4.0 runs as PyPI's aarch64 CPU build under qemu-user (``scripts/oldest-torch`` says
why and how; PyPI's x86_64 2.4.0 is a CUDA build of several GB). Skipped where it cannot be
had, except under CI (``CI`` set), whose setup provides it: there its absence fails. Each
run of torch 2.4 under emulation takes about 25 s, most of it ``import torch``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import hostreg.torch as ht

from support import oldest_torch_sd as oldest  # the same builder both torches run

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "oldest_torch_sd.py"


@pytest.fixture(scope="module")
def torch24() -> list[str]:
    got = subprocess.run([str(REPO / "scripts" / "oldest-torch")], capture_output=True, text=True, timeout=900)
    if got.returncode != 0 or not got.stdout.strip():
        if os.environ.get("CI"):
            pytest.fail(f"torch 2.4.0 under qemu-aarch64 is missing: CI sets it up (scripts/setup): {got.stderr}")
        pytest.skip(f"torch 2.4.0 under qemu-aarch64 is not to be had here: {got.stderr.strip()}")
    return shlex.split(got.stdout)


def run24(torch24: list[str], *args: str) -> dict:
    """Runs tests/support/oldest_torch_sd.py under torch 2.4.0; its JSON line."""
    got = subprocess.run([*torch24, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, f"torch 2.4 failed ({got.returncode}):\n{got.stderr[-3000:]}"
    out = json.loads(got.stdout.strip().splitlines()[-1])
    assert out["torch"] == "2.4.0", out["torch"]
    return out


def test_torch_2_4_reads_and_converts_what_hostreg_writes(torch24: list[str], tmp_path: Path) -> None:
    sd = oldest.build(1)
    ckpt = tmp_path / "by-hostreg"
    w = ht.FileSystemWriter(ckpt)
    dcp.save(sd, storage_writer=w, no_dist=True)
    assert w.stats.requests > 0  # hostreg's engine wrote it
    want = oldest.digest(sd)

    got = run24(torch24, "load", str(ckpt), "1", str(tmp_path / "by-hostreg.pt"))
    assert got["digest"] == want
    assert got["converted"] == want


def test_hostreg_reads_what_torch_2_4_writes(torch24: list[str], tmp_path: Path) -> None:
    ckpt = tmp_path / "by-torch-2.4"
    written = run24(torch24, "save", str(ckpt), "2")
    dest = oldest.empty_like(oldest.build(2))
    r = ht.FileSystemReader(ckpt)
    dcp.load(dest, storage_reader=r, no_dist=True)
    assert oldest.digest(dest) == written["digest"]
    assert r.stats.requests > 0  # hostreg's engine read the tensors, not DCP's fallback alone
    assert oldest.digest(dest) == oldest.digest(oldest.build(2))  # and torch's generator agrees across the two
