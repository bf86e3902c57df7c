"""Verification against what was saved (verify.py): a changed byte anywhere in a checkpoint's
files is found by FileSystemReader(verify=True) and by `hostreg verify`, naming the file, the
tensor and the byte; hostreg's .metadata is checked against its CRC-32 at every load; DCP's
stock reader still reads .metadata with hostreg's trailer; an intact checkpoint passes."""

from __future__ import annotations

import io
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import hostreg.torch as ht
from hostreg.torch._checkpoint.verify import verify_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
HOSTREG = str(Path(sys.executable).parent / "hostreg")


def state() -> dict:
    g = torch.Generator().manual_seed(3)
    return {
        "a": torch.randn(100, generator=g),
        "b": torch.randn(7, 9, generator=g).to(torch.bfloat16),
        "big": torch.randn(300_000, generator=g),  # past 1 MiB: read apart by the reader
        "blob": io.BytesIO(b"some bytes"),
        "n": 3,
    }


def destination() -> dict:
    return {"a": torch.zeros(100), "b": torch.zeros(7, 9, dtype=torch.bfloat16), "big": torch.zeros(300_000)} | {
        "blob": io.BytesIO(),
        "n": 0,
    }


@pytest.fixture(params=["hostreg", "stock"])
def ckpt(request, tmp_path: Path) -> Path:
    path = tmp_path / request.param
    w = ht.FileSystemWriter(path) if request.param == "hostreg" else dcp.FileSystemWriter(path)
    dcp.save(state(), storage_writer=w, no_dist=True)
    return path


def spans(path: Path) -> list[tuple[str, int, int]]:
    """(key, offset, length) of every item of the data file, from the metadata."""
    with open(path / ".metadata", "rb") as f:
        md = pickle.load(f)
    return sorted(((k.fqn, i.offset, i.length) for k, i in md.storage_data.items()), key=lambda s: s[1])


def flip(file: Path, at: int) -> None:
    """Changes byte ``at`` of ``file`` in place (flipping it back restores it)."""
    with open(file, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ 0x5A]))


def test_an_intact_checkpoint_passes_and_loads_verified(ckpt: Path):
    report = verify_checkpoint(str(ckpt))
    assert not report.problems and report.items == 5 and report.files == 1  # a, b, big, blob, n
    out = destination()
    r = ht.FileSystemReader(ckpt, verify=True)
    dcp.load(out, storage_reader=r, planner=ht.LoadPlanner(), no_dist=True)
    want = state()
    for k in ("a", "b", "big"):
        assert torch.equal(out[k], want[k]), k
    assert out["blob"].getvalue() == b"some bytes" and out["n"] == 3
    r = subprocess.run([HOSTREG, "verify", str(ckpt)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "intact" in r.stdout, r.stdout + r.stderr


def test_a_flipped_byte_anywhere_in_the_data_file_is_found_naming_its_tensor(ckpt: Path):
    """Every byte of one container (headers, padding, data, central directory, end records),
    the first and last 64 and 150 others of each other one, and the zero bytes between them."""
    data = ckpt / "__0_0.distcp"
    raw = data.read_bytes()
    items = spans(ckpt)
    rng = random.Random(5)
    positions = []
    for key, off, length in items:
        if key == "a":
            positions += [(p, key) for p in range(off, off + length)]
        else:
            ends = [*range(off, off + 64), *range(off + length - 64, off + length)]
            positions += [(p, key) for p in [*ends, *(rng.randrange(off, off + length) for _ in range(150))]]
    covered = [False] * len(raw)
    for _, off, length in items:
        covered[off : off + length] = [True] * length
    positions += [(p, "") for p in range(len(raw)) if not covered[p]]  # between containers (hostreg's)
    missed = []
    for p, key in positions:
        flip(data, p)
        problems = verify_checkpoint(str(ckpt)).problems
        flip(data, p)
        if not any(q.item == key and q.file == "__0_0.distcp" for q in problems):
            missed.append((p, key, [str(q) for q in problems]))
    assert not missed, f"{len(missed)} of {len(positions)} flipped bytes not found, e.g. {missed[:3]}"
    assert data.read_bytes() == raw and not verify_checkpoint(str(ckpt)).problems


def test_the_reader_with_verify_names_the_tensor_and_the_byte(ckpt: Path):
    data = ckpt / "__0_0.distcp"
    key, off, length = next(s for s in spans(ckpt) if s[0] == "b")
    flip(data, off + length // 2)
    with pytest.raises(BaseException, match=r"is not what was saved: b \(in __0_0\.distcp\), byte [\d,]+: "):
        dcp.load(destination(), storage_reader=ht.FileSystemReader(ckpt, verify=True), no_dist=True)
    r = subprocess.run([HOSTREG, "verify", str(ckpt)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "__0_0.distcp" in r.stdout and " b " in r.stdout, r.stdout + r.stderr


def test_hostregs_metadata_is_checked_at_every_load_and_stock_dcp_still_reads_it(tmp_path: Path):
    path = tmp_path / "c"
    dcp.save(state(), storage_writer=ht.FileSystemWriter(path), no_dist=True)
    out = destination()
    dcp.load(out, storage_reader=dcp.FileSystemReader(path), no_dist=True)  # the trailer is past the pickle
    assert torch.equal(out["big"], state()["big"])
    meta = path / ".metadata"
    raw = meta.read_bytes()
    rng = random.Random(9)
    for p in [*rng.sample(range(len(raw) - 20), 40), *range(len(raw) - 20, len(raw))]:  # the pickle, the trailer
        flip(meta, p)
        problems = verify_checkpoint(str(path)).problems
        flip(meta, p)
        assert problems and problems[0].file == ".metadata", p


def test_a_missing_checkpoint_is_a_problem_not_a_crash(tmp_path: Path):
    assert verify_checkpoint(str(tmp_path)).problems[0].what == "no metadata file: not a checkpoint"
    r = subprocess.run([HOSTREG, "verify", str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "not a directory" in r.stdout + r.stderr
