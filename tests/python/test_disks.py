"""Disks that are not the happy case, each made for real in a private mount namespace
(``unshare -m``, as root; skipped with the reason where it cannot be made): a device of
4 KiB logical sectors (a loop device, ext4), a filesystem with neither O_DIRECT nor fallocate
(ramfs), a read-only directory over an existing checkpoint. Each save either works, read back
verified, or fails with a clear error and leaves the previous checkpoint loading as it was.
(ENOSPC and RLIMIT_FSIZE half-way, and tmpfs without O_DIRECT: test_checkpoint.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import sys, warnings, torch, torch.distributed.checkpoint as dcp, hostreg.torch as ht
    warnings.filterwarnings("ignore")
    path, save = sys.argv[1], int(sys.argv[2])
    sd = {f"t{k}": torch.full((300_000 + k,), float(save * 100 + k)) for k in range(3)}
    sd["small"] = torch.arange(10.0) + save
    w = ht.FileSystemWriter(path)
    try:
        dcp.save(sd, storage_writer=w, no_dist=True)
    except BaseException as e:
        print("SAVE FAILED", str(e).splitlines()[-1] if str(e) else type(e).__name__)
        sys.exit(3)
    print("direct", w.stats.direct)
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    r = ht.FileSystemReader(path, verify=True)
    dcp.load(out, storage_reader=r, no_dist=True)
    assert all(torch.equal(out[k], v) for k, v in sd.items())
    print("LOADED", save)
    """
)


def outcome(path: Path) -> str:
    """Which save's values the checkpoint in ``path`` loads ("none" when it does not)."""
    code = textwrap.dedent(
        f"""
        import warnings, torch, torch.distributed.checkpoint as dcp, hostreg.torch as ht
        warnings.filterwarnings("ignore")
        sd = {{f"t{{k}}": torch.zeros(300_000 + k) for k in range(3)}}
        sd["small"] = torch.zeros(10)
        try:
            dcp.load(sd, storage_reader=ht.FileSystemReader({str(path)!r}, verify=True), no_dist=True)
        except BaseException:
            print("none"); raise SystemExit
        s = int(sd["t0"][0]) // 100
        ok = all(torch.equal(sd[f"t{{k}}"], torch.full((300_000 + k,), float(s * 100 + k))) for k in range(3))
        print(s if ok and torch.equal(sd["small"], torch.arange(10.0) + s) else "mixed")
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else f"error: {r.stderr[-500:]}"


def in_namespace(setup: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """Runs ``setup`` (shell, mounts) then the child save of ``args`` in a private mount
    namespace: its mounts are gone when it ends."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cmd = f"{setup} && {sys.executable} {script} {' '.join(args)}"
    return subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=300)


def test_a_device_of_4k_sectors_saves_and_loads_verified_with_o_direct(tmp_path: Path):
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    loop = subprocess.run(
        ["losetup", "--find", "--show", "--sector-size", "4096", str(image)], capture_output=True, text=True
    )
    if loop.returncode != 0:
        pytest.skip(f"no loop device with 4 KiB sectors here: {loop.stderr.strip()}")
    dev = loop.stdout.strip()
    try:
        mk = subprocess.run(["mkfs.ext4", "-q", "-b", "4096", dev], capture_output=True, text=True)
        if mk.returncode != 0:
            pytest.skip(f"mkfs.ext4 failed: {mk.stderr.strip()}")
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        sector = Path(f"/sys/block/{os.path.basename(dev)}/queue/logical_block_size").read_text().strip()
        assert sector == "4096"
        r = in_namespace(f"mount {dev} {mnt}", [f"{mnt}/ckpt", "1"], tmp_path)
        assert r.returncode == 0 and "LOADED 1" in r.stdout, r.stdout + r.stderr[-2000:]
        assert "direct True" in r.stdout  # O_DIRECT at 4 KiB alignment throughout
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)


def test_a_filesystem_without_o_direct_or_fallocate_saves_and_loads_verified(tmp_path: Path):
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    r = in_namespace(f"mount -t ramfs none {mnt}", [f"{mnt}/ckpt", "1"], tmp_path)
    if "mount:" in r.stderr and "LOADED" not in r.stdout:
        pytest.skip(f"cannot mount a ramfs here: {r.stderr.strip()}")
    assert r.returncode == 0 and "LOADED 1" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "direct False" in r.stdout  # ramfs refuses O_DIRECT: the page cache, said once


def test_a_read_only_directory_fails_the_save_and_keeps_the_old_checkpoint(tmp_path: Path):
    ckpt = tmp_path / "ckpt"
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    first = subprocess.run([sys.executable, str(script), str(ckpt), "1"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    r = in_namespace(f"mount --bind {ckpt} {ckpt} && mount -o remount,bind,ro {ckpt}", [str(ckpt), "2"], tmp_path)
    if "mount:" in r.stderr and "SAVE FAILED" not in r.stdout:
        pytest.skip(f"cannot make a read-only bind mount here: {r.stderr.strip()}")
    assert r.returncode == 3 and "Read-only file system" in r.stdout, r.stdout + r.stderr[-2000:]
    assert outcome(ckpt) == "1"  # nothing of the old checkpoint was removed or changed
    shutil.rmtree(ckpt)
