"""`hostreg stage`, the main job, run as a user runs it."""

from __future__ import annotations

import os
import re
import shutil
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
        [*prefix, HOSTREG, "stage", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
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


# ---- --save DIR: the staged dict as a DCP checkpoint, loaded back ------------------------------


def test_save_writes_a_checkpoint_that_stock_dcp_loads(tmp_path: Path):
    import torch.distributed.checkpoint as dcp

    from hostreg.cli import models

    r = stage("--model", "tiny", "--save", str(tmp_path / "ckpt"))
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "values verified after load") == "yes"
    assert row(r.stdout, "checkpoint I/O") == "O_DIRECT"  # this disk takes it
    save_s = float(row(r.stdout, "save s (hostreg FileSystemWriter)"))
    assert save_s > 0
    rate, ratio = row(r.stdout, "save GiB/s (x disk ceiling)").split()
    write_ceiling = float(row(r.stdout, "disk ceiling write / read GiB/s").split(" / ")[0])
    # The ratio is of the two figures printed, each rounded to 0.01 (and the ratio itself too).
    r_, c_, x_ = float(rate), write_ceiling, float(ratio.strip("()x"))
    assert (r_ - 0.005) / (c_ + 0.005) - 0.005 <= x_ <= (r_ + 0.005) / max(c_ - 0.005, 1e-9) + 0.005, (rate, ratio, c_)
    assert "fio" in row(r.stdout, "ceiling measured by")  # scripts/setup installs fio
    # The checkpoint stays, and the stock reader loads it: the same weights models.build makes.
    want = models.build("tiny").state_dict()
    got = {k: torch.full_like(v, float("nan")) for k, v in want.items()}
    dcp.load(got, storage_reader=dcp.FileSystemReader(str(tmp_path / "ckpt")), no_dist=True)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert not [f for f in os.listdir(tmp_path / "ckpt") if f.startswith(".hostreg-ceiling")]  # the probe file is gone


def test_save_with_the_torch_engine_and_a_checkpoint_file(tmp_path: Path):
    sd = {"w": torch.randn(300, 7), "i": torch.arange(5), "b": torch.tensor([True, False]), "step": torch.tensor(3)}
    torch.save(sd, tmp_path / "sd.pt")
    r = stage("--checkpoint", str(tmp_path / "sd.pt"), "--engine", "torch", "--save", str(tmp_path / "c"))
    assert r.returncode == 0, r.stderr
    assert row(r.stdout, "values verified after load") == "yes"


def test_save_where_it_cannot_fails_with_the_reason(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    r = stage("--model", "tiny", "--save", str(tmp_path / "file" / "ckpt"))
    assert r.returncode == 1 and "save failed" in r.stderr and "Traceback" not in r.stderr
    assert f"cannot use {tmp_path / 'file' / 'ckpt'}" in r.stderr and "Not a directory" in r.stderr


def _in_mount_namespace(script: str) -> subprocess.CompletedProcess:
    """Runs ``script`` with sh in a mount namespace of its own (its mounts vanish with it)."""
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=600,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m for a small tmpfs"
)
def test_save_to_a_full_filesystem_fails_before_writing():
    # A 4 MiB tmpfs in a mount namespace of its own, for GPT-2 small (475 MiB).
    script = f"mount -t tmpfs -o size=4m none /mnt && exec {HOSTREG} stage --save /mnt/ckpt"
    r = _in_mount_namespace(script)
    assert r.returncode == 1 and "save failed" in r.stderr, r.stderr
    assert "bytes free; the checkpoint needs about 497,759,232" in r.stderr


@pytest.mark.parametrize("with_fio", [True, False], ids=["fio", "own-probe"])
def test_disk_ceiling_measures_and_leaves_nothing(tmp_path: Path, monkeypatch, with_fio: bool):
    from hostreg.cli import ceiling

    if not with_fio:
        monkeypatch.setattr(ceiling.shutil, "which", lambda name: None)
    c = ceiling.measure(tmp_path, 64 << 20)
    assert c.direct and c.write > 1e6 and c.read > 1e6  # at least 1 MB/s: it really moved the bytes
    assert c.tool.startswith("fio ") == with_fio and ("no fio on PATH" in c.tool) == (not with_fio)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError):
        ceiling.measure(tmp_path, 0)


@pytest.mark.parametrize("engine", ["hostreg", "torch"])
def test_tied_weights_and_views_count_their_bytes_once(tmp_path: Path, engine: str):
    w = torch.randn(64, 1000)  # 256,000 bytes
    sd = {"emb": w, "head": w, "rows": w[10:20], "bias": torch.zeros(16)}  # tied, a view, one of its own
    torch.save(sd, tmp_path / "tied.pt")
    r = stage("--checkpoint", str(tmp_path / "tied.pt"), "--engine", engine)
    assert r.returncode == 0, r.stderr
    staged = int(row(r.stdout, "bytes staged").split()[0].replace(",", ""))
    if engine == "hostreg":
        assert staged == 256_000 + 64, "the shared bytes once, and the bias"
    else:  # PyTorch's _create_cpu_state_dict copies each tensor on its own
        assert staged == 2 * 256_000 + 40_000 + 64
    assert row(r.stdout, "values verified") == "yes"


def test_an_interrupted_probe_stops_its_threads_and_leaves_no_file(tmp_path: Path):
    code = """
import _thread, os, shutil, signal, sys, threading
# Ctrl-C as in a terminal, whatever this process inherited (a shell's background job starts
# with SIGINT ignored, and then interrupt_main() does nothing)
signal.signal(signal.SIGINT, signal.default_int_handler)
from hostreg.cli import ceiling
shutil.which = lambda name: None  # the probe of its own, not fio
write = os.pwrite
def interrupted(fd, buf, off):
    _thread.interrupt_main()  # Ctrl-C while its threads write
    return write(fd, buf, off)
os.pwrite = interrupted
try:
    ceiling.measure(sys.argv[1], 64 << 20)
except KeyboardInterrupt:
    print("interrupted", os.listdir(sys.argv[1]), threading.active_count())
"""
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["interrupted", "[]", "1"], "no file, no thread left"


@pytest.mark.skipif(shutil.which("fio") is None or shutil.which("pgrep") is None, reason="needs fio and pgrep")
def test_an_interrupted_fio_ceiling_leaves_no_fio_and_no_file(tmp_path: Path):
    import signal
    import time

    p = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from hostreg.cli import ceiling; ceiling.measure(sys.argv[1], 1 << 30)",
            str(tmp_path),
        ],
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while subprocess.run(["pgrep", "-f", "--", f"--filename={tmp_path}"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline and p.poll() is None, "fio never started"
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)  # to hostreg's process only, as kill -INT would
    p.wait(timeout=60)
    time.sleep(0.5)
    assert subprocess.run(["pgrep", "-f", "--", f"--filename={tmp_path}"], capture_output=True).returncode == 1, (
        "a fio job survived"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m for a small tmpfs"
)
def test_a_save_that_runs_out_of_space_says_so_in_one_line(tmp_path: Path):
    # 3,000 one-element tensors: 12 KB of values pass the free-space check, their containers
    # (about 1.5 KB each) do not fit in 2 MiB: DCP's CheckpointException carries the ENOSPC.
    torch.save({f"t{i}": torch.ones(1) for i in range(3000)}, tmp_path / "many.pt")
    script = f"mount -t tmpfs -o size=2m none /mnt && exec {HOSTREG} stage --checkpoint {tmp_path / 'many.pt'} --save /mnt/ck"
    r = _in_mount_namespace(script)
    assert r.returncode == 1 and "save failed" in r.stderr, r.stderr
    assert "cannot save the checkpoint to /mnt/ck: OSError: [Errno 28]" in r.stderr
    assert "FrameSummary" not in r.stderr and "tuple" not in r.stderr


def test_paths_are_printed_as_they_are_not_as_markup(tmp_path: Path):
    d = tmp_path / "ck[/]"
    r = stage("--model", "tiny", "--save", str(d))
    assert r.returncode == 0, r.stderr
    assert str(d) in r.stdout and "Traceback" not in r.stderr
    r = stage("--checkpoint", str(tmp_path / "[/]missing.pt"))
    assert r.returncode == 1 and "does not exist" in r.stderr and "[/]missing.pt" in r.stderr


def test_the_checkpoints_size_counts_only_its_own_files(tmp_path: Path):
    d = tmp_path / "ck"
    d.mkdir()
    (d / "unrelated.bin").write_bytes(b"x" * (5 << 20))
    r = stage("--model", "tiny", "--save", str(d))
    assert r.returncode == 0, r.stderr
    mine = (d / ".metadata").stat().st_size + (d / "__0_0.distcp").stat().st_size
    assert row(r.stdout, "checkpoint saved to").endswith(f"({mine:,} bytes of the checkpoint's files)")


@pytest.mark.parametrize("args", [["--device", "-1"], ["--device", str(2**31)], ["--device", "x"], ["--save", ""]])
def test_bad_device_and_directory_are_usage_errors(args: list[str]):
    r = stage("--model", "tiny", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "error: argument" in r.stderr, r.stderr


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    from hostreg import cli
    from hostreg.cli import stage as stage_job

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(stage_job, "stage_state_dict", interrupted)
    assert cli.main(["stage", "--model", "tiny", "--no-progress"]) == 130
    assert capsys.readouterr().err == "hostreg: interrupted\n"


def test_a_failed_save_leaves_nothing_registered_or_locked(tmp_path: Path):
    import gc

    import hostreg
    from hostreg.cli import models
    from hostreg.cli import stage as stage_job

    (tmp_path / "file").write_text("x")
    sd = models.build("tiny").state_dict()
    before = hostreg.locked_bytes()
    with pytest.raises(stage_job.SaveError) as e:
        stage_job.stage_state_dict(sd, save_to=tmp_path / "file" / "ck")
    gc.collect()
    assert hostreg.stats().registrations == 0 and hostreg.locked_bytes() <= before, "released while the error is held"
    assert "cannot use" in str(e.value)


@pytest.mark.parametrize("collecting", [True, False])
def test_a_commands_imports_run_with_the_collector_paused_and_what_they_made_frozen(collecting: bool):
    import gc

    from hostreg.cli import _kept_for_life

    (gc.enable if collecting else gc.disable)()
    try:
        frozen = gc.get_freeze_count()
        with _kept_for_life():
            assert not gc.isenabled()
            made = [[] for _ in range(100)]  # tracked containers, as a module's objects are
        assert gc.isenabled() is collecting
        assert gc.get_freeze_count() >= frozen + len(made)
        frozen = gc.get_freeze_count()
        with pytest.raises(ImportError), _kept_for_life():
            import hostreg_no_such_module  # noqa: F401
        assert gc.isenabled() is collecting  # as it was, and nothing frozen after a failed import
        assert gc.get_freeze_count() == frozen
    finally:
        gc.enable()


def test_version_and_the_c_packages_folders():
    """``hostreg --version`` says the version; ``--cmakedir`` and ``--includedir`` name the
    folders of the CMake package and the C headers the wheel installs (what scripts/test-wheels
    builds examples/ against, with find_package)."""
    import hostreg

    def cli(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "hostreg", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert cli("--version") == f"hostreg {hostreg.__version__}"
    cmake = Path(cli("--cmakedir"))
    assert (cmake / "hostregConfig.cmake").is_file() and (cmake / "hostregTargets.cmake").is_file()
    assert cmake.parent == Path(hostreg.__file__).parent
    assert (Path(cli("--includedir")) / "hostreg" / "hostreg.h").is_file()


@pytest.mark.parametrize("args", [["stage"], ["bench"], ["verify", "."]])
def test_commands_that_need_torch_say_how_to_get_it(args: list[str]):
    # torch made unimportable in the child (None in sys.modules: ImportError on import)
    code = f"import sys; sys.modules['torch'] = None; from hostreg.cli import main; sys.exit(main({args!r}))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "needs PyTorch" in r.stderr and "pip install" in r.stderr and "Traceback" not in r.stderr


def test_bench_times_cold_and_warm_against_the_ceiling_and_leaves_nothing(tmp_path: Path):
    r = subprocess.run(
        [HOSTREG, "bench", "--dir", str(tmp_path), "--mib", "8", "--tensors", "16", "--repeats", "1", "--stock"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    names = (
        "ceiling: write",
        "ceiling: read",
        "hostreg save, cold",
        "hostreg save, warm",
        "hostreg load, cold",
        "hostreg load, warm",
        "stock dcp.save, first",
        "stock dcp.load",
    )
    for name in names:  # each with its seconds, GB/s and ratio to the ceiling
        assert re.search(rf"{re.escape(name)}[^│]*│\s*[0-9.]+\s*│\s*[0-9.]+\s*│\s*[0-9.]+\s*│", r.stdout), name
    assert list(tmp_path.iterdir()) == []  # the checkpoints and the ceiling's file removed
    bad = subprocess.run([HOSTREG, "bench", "--mib", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must be positive" in bad.stderr
    bad = subprocess.run(
        [HOSTREG, "bench", "--mib", "1", "--tensors", "10000000"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--tensors is at most" in bad.stderr
    # A directory it cannot write in (sysfs refuses new files, even to root): one line, exit 1.
    bad = subprocess.run(
        [HOSTREG, "bench", "--dir", "/sys/kernel", "--mib", "1"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 1 and "hostreg bench: PermissionError" in bad.stderr and "Traceback" not in bad.stderr
