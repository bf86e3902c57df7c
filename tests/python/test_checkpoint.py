"""hostreg.torch.FileSystemWriter / FileSystemReader against the real thing: torch.save's own
bytes, DCP's stock reader and writer, dcp_to_torch_save, both async checkpointers, two ranks
over gloo, and saves that fail or die half-way (ENOSPC on a small tmpfs, RLIMIT_FSIZE,
SIGKILL)."""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import run_python
from ranks import app_state, build, differences, full_values, run_ranks, train_step
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import hostreg.torch as ht
from hostreg.torch._checkpoint import container as _container

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def sample() -> dict:
    g = torch.Generator().manual_seed(5)
    big = torch.randn(700, 1000, generator=g)  # 2.8 MB: written from its memory with O_DIRECT
    return {
        "big": big,
        "view": big[100:300],  # a view of a larger storage
        "t": torch.randn(33, 17, generator=g).t(),  # not contiguous
        "bf16": torch.randn(300_000, generator=g).to(torch.bfloat16),
        "step": torch.tensor(7.0),
        "empty": torch.empty(0, 3),
        "mask": torch.rand(99, generator=g) > 0.5,
        "c": torch.randn(5, 2, generator=g, dtype=torch.complex64),
        "i64": torch.arange(-50, 50),
        "lr": 1.5,
        "blob": io.BytesIO(b"not a tensor"),
    }


def zeros_like(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        out[k] = torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
    out["blob"] = io.BytesIO()
    return out


def assert_same(got: dict, want: dict) -> None:
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v), k
    assert got["lr"] == want["lr"]
    assert got["blob"].getvalue() == want["blob"].getvalue()


def containers(path: Path) -> list[bytes]:
    """Every tensor item of a checkpoint as the bytes .metadata says it has."""
    md = dcp.FileSystemReader(str(path)).read_metadata()
    out = []
    for index, info in md.storage_data.items():
        if index.fqn in ("lr", "blob"):  # DCP's own torch.save of a non-tensor
            continue
        with open(path / info.relative_path, "rb") as f:
            f.seek(info.offset)
            out.append(f.read(info.length))
    return out


# ---- the encoding --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
        torch.complex64,
        torch.complex128,
    ],
)
@pytest.mark.parametrize("shape", [(), (0,), (1,), (7,), (3, 5), (2, 0, 4), (2, 3, 4, 5)])
def test_pickle_is_torch_saves_byte_for_byte(dtype: torch.dtype, shape: tuple):
    t = torch.ones(shape, dtype=dtype)
    buf = io.BytesIO()
    torch.save(t, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        assert _container.tensor_pickle(dtype, shape) == z.read("archive/data.pkl")


def test_containers_are_valid_zip_with_checksums_and_torch_loads_them(tmp_path: Path):
    sd = sample()
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path / "h"), no_dist=True)
    tensors = containers(tmp_path / "h")
    assert len(tensors) == 9
    for b in tensors:
        with zipfile.ZipFile(io.BytesIO(b)) as z:
            assert z.testzip() is None  # every record's CRC-32 checks, the data's included
            names = [n.split("/", 1)[1] for n in z.namelist()]
        assert names[0] == "data.pkl" and "data/0" in names and "byteorder" in names
        torch.load(io.BytesIO(b), weights_only=True)


# ---- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("staged", [False, True], ids=["plain", "arena"])
def test_hostreg_writer_stock_reader_and_dcp_to_torch_save(tmp_path: Path, staged: bool):
    sd = sample()
    src = ht.create_cpu_state_dict(sd) if staged else sd
    if staged:
        ht.copy_state_dict(sd, src)
    w = ht.FileSystemWriter(tmp_path / "h")
    dcp.save(src, storage_writer=w, no_dist=True)
    assert w.stats.direct, "this disk takes O_DIRECT"
    assert w.stats.direct_bytes >= 2_000_000, w.stats  # the big tensor's middle, from its own memory
    out = zeros_like(sd)
    dcp.load(out, storage_reader=dcp.FileSystemReader(str(tmp_path / "h")), no_dist=True)
    assert_same(out, sd)
    dcp_to_torch_save(str(tmp_path / "h"), str(tmp_path / "all.pt"))
    flat = torch.load(tmp_path / "all.pt", weights_only=False)
    assert torch.equal(flat["big"], sd["big"]) and torch.equal(flat["t"], sd["t"])
    assert sorted(os.listdir(tmp_path / "h")) == [".metadata", "__0_0.distcp"]
    del src, out, flat


@pytest.mark.parametrize("writer", ["stock", "stock-2-threads", "stock-per-item", "hostreg", "hostreg-per-item"])
def test_hostreg_reader_reads_stock_and_own_checkpoints(tmp_path: Path, writer: str):
    sd = sample()
    w = {
        "stock": lambda p: dcp.FileSystemWriter(p),
        "stock-2-threads": lambda p: dcp.FileSystemWriter(p, thread_count=2),
        "stock-per-item": lambda p: dcp.FileSystemWriter(p, single_file_per_rank=False),
        "hostreg": lambda p: ht.FileSystemWriter(p),
        "hostreg-per-item": lambda p: ht.FileSystemWriter(p, single_file_per_rank=False, thread_count=1),
    }[writer](str(tmp_path / "c"))
    dcp.save(sd, storage_writer=w, no_dist=True)
    out = zeros_like(sd)
    r = ht.FileSystemReader(tmp_path / "c")
    dcp.load(out, storage_reader=r, no_dist=True)
    assert_same(out, sd)
    assert r.stats.direct and r.stats.direct_bytes + r.stats.bounced_bytes >= sd["big"].nbytes


def test_reader_into_other_dtypes_and_non_contiguous_destinations(tmp_path: Path):
    sd = {"a": torch.randn(64, 48), "b": torch.randn(1000)}
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path / "c"), no_dist=True)
    out = {"a": torch.zeros(48, 64).t(), "b": torch.zeros(1000, dtype=torch.float64)}  # staged, then copied
    r = ht.FileSystemReader(tmp_path / "c")
    dcp.load(out, storage_reader=r, no_dist=True)
    assert torch.equal(out["a"], sd["a"]) and torch.equal(out["b"], sd["b"].double())
    assert r.stats.bounced_bytes + r.stats.direct_bytes >= sd["a"].nbytes + sd["b"].nbytes  # read by hostreg


def test_truncated_file_is_an_error_not_garbage(tmp_path: Path):
    sd = sample()
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path / "c"), no_dist=True)
    f = tmp_path / "c" / "__0_0.distcp"
    os.truncate(f, f.stat().st_size // 2)
    with pytest.raises(BaseException, match="truncated|EIO|Input/output"):  # CheckpointException is a BaseException
        dcp.load(zeros_like(sd), storage_reader=ht.FileSystemReader(tmp_path / "c"), no_dist=True)


BUFFERED = textwrap.dedent(
    """
    import io, logging, sys, warnings, torch
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")
    import torch.distributed.checkpoint as dcp
    import hostreg.torch as ht
    from hostreg.doctor import probe_direct_io
    d = sys.argv[1]
    sd = {"big": torch.randn(1000, 1000), "small": torch.arange(10)}
    for i in range(2):
        w = ht.FileSystemWriter(f"{d}/c{i}")
        dcp.save(sd, storage_writer=w, no_dist=True)
        assert not w.stats.direct, w.stats  # through the page cache (still no bounce copy)
    out = {"big": torch.zeros(1000, 1000), "small": torch.zeros(10, dtype=torch.long)}
    r = ht.FileSystemReader(f"{d}/c1")
    dcp.load(out, storage_reader=r, no_dist=True)
    assert not r.stats.direct and torch.equal(out["big"], sd["big"]) and torch.equal(out["small"], sd["small"])
    print("PROBE", probe_direct_io(d))
    """
)


def test_a_filesystem_without_o_direct_is_written_buffered_and_said_once_per_directory(tmp_path: Path):
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    script = tmp_path / "buffered.py"
    script.write_text(BUFFERED)
    # ramfs refuses O_DIRECT (EINVAL), as some network filesystems do; tmpfs takes it since Linux 6.6.
    cmd = f"mount -t ramfs none {mnt} && {sys.executable} {script} {mnt}"
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    if r.returncode == 32 and "mount" in r.stderr:
        pytest.skip(f"cannot mount a ramfs here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr[-3000:]
    said = [line for line in r.stderr.splitlines() if line.startswith("LOG") and "O_DIRECT" in line]
    assert len(said) == 2, r.stderr  # once for each checkpoint directory, not per file or save
    assert "PROBE (False," in r.stdout and "page cache" in r.stdout, r.stdout
    from hostreg.doctor import probe_direct_io

    assert probe_direct_io(tmp_path) == (True, "")
    out = subprocess.run(
        [str(Path(sys.executable).parent / "hostreg"), "doctor", "--checkpoint-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    assert f"checkpoints in {tmp_path}" in out and "O_DIRECT (disk speed" in out, out


STAGERS = ["hostreg-async", "hostreg-sync", "default", "none"]


def _async_saves(rank: int, world: int, path: str, checkpointer: str, stagers: list[str]) -> None:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    sd = {k: v for k, v in sample().items() if k != "blob"}
    kind = getattr(state_dict_saver.AsyncCheckpointerType, checkpointer.upper())
    for name in stagers:
        s = {
            "hostreg-async": lambda: ht.Stager(async_staging=True),
            "hostreg-sync": lambda: ht.Stager(),
            "default": lambda: DefaultStager(StagingOptions(False, False, False, False)),
            "none": lambda: None,
        }[name]()
        try:
            for i in range(2):
                where = f"{path}/{name}-{i}"
                res = dcp.async_save(
                    sd, storage_writer=ht.FileSystemWriter(where), async_stager=s, async_checkpointer_type=kind
                )
                (res.upload_completion if hasattr(res, "upload_completion") else res).result(timeout=120)
                out = {k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in sd.items()}
                dcp.load(out, storage_reader=ht.FileSystemReader(where))
                for k, v in sd.items():
                    if isinstance(v, torch.Tensor):
                        assert torch.equal(out[k], v), (name, k)
                del res, out
        finally:
            if s is not None:
                s.close()


@pytest.mark.parametrize("checkpointer", ["thread", "process"])
def test_async_save_with_any_stager_and_both_checkpointers(tmp_path: Path, checkpointer: str):
    run_ranks(_async_saves, (str(tmp_path), checkpointer, STAGERS), world=1, timeout=300)


def _two_ranks(rank: int, world: int, path: str) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    model, opt = build("fsdp", seed=0, mesh=mesh)
    train_step(model, opt, 0)
    sd = app_state(model, opt)
    want = full_values(sd)
    stager = ht.Stager(async_staging=True)
    res = dcp.async_save(
        sd,
        storage_writer=ht.FileSystemWriter(f"{path}/fsdp"),
        async_stager=stager,
        async_checkpointer_type=state_dict_saver.AsyncCheckpointerType.PROCESS,
    )
    res.upload_completion.result(timeout=120)
    stager.close()
    for reader in (ht.FileSystemReader(f"{path}/fsdp"), dcp.FileSystemReader(f"{path}/fsdp")):
        model2, opt2 = build("tp", seed=1, mesh=mesh)  # another sharding: resharded on load
        train_step(model2, opt2, 0)
        sd2 = app_state(model2, opt2)
        dcp.load(sd2, storage_reader=reader)
        set_state_dict(model2, opt2, model_state_dict=sd2["model"], optim_state_dict=sd2["optim"])
        bad = differences(full_values(app_state(model2, opt2)), want)
        assert not bad, f"{type(reader).__module__}: " + "; ".join(bad[:5])
    if rank == 0:
        torch.save(want, f"{path}/want.pt")


def test_two_ranks_fsdp_saved_and_loaded_resharded_over_gloo(tmp_path: Path):
    run_ranks(_two_ranks, (str(tmp_path),), world=2, timeout=300)
    want = torch.load(tmp_path / "want.pt", weights_only=False)
    model, opt = build("plain", seed=2)
    train_step(model, opt, 0)
    sd = app_state(model, opt)
    dcp.load(sd, storage_reader=ht.FileSystemReader(tmp_path / "fsdp"), no_dist=True)  # 2 ranks -> 1 process
    bad = differences(full_values(sd), want)
    assert not bad, "; ".join(bad[:5])


# ---- saves that fail or die half-way -------------------------------------------------------

SAVER = textwrap.dedent(
    """
    import os, sys, warnings, torch
    warnings.filterwarnings("ignore")
    import torch.distributed.checkpoint as dcp
    import hostreg.torch as ht
    path, mib, loops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for i in range(loops):
        sd = {f"t{k}": torch.full((mib << 18,), float(i * 100 + k)) for k in range(4)}
        sd["step"] = torch.tensor(float(i))
        dcp.save(sd, storage_writer=ht.FileSystemWriter(path), no_dist=True)
        print("saved", i, flush=True)
    """
)


def load_outcome(path: Path, mib: int) -> str:
    """'none' when the directory does not load (DCP raises), 'whole' when it loads one save's
    values completely; anything else fails the test."""
    sd = {f"t{k}": torch.zeros(mib << 18) for k in range(4)}
    sd["step"] = torch.tensor(-1.0)
    try:
        dcp.load(sd, storage_reader=ht.FileSystemReader(path), no_dist=True)
    except BaseException as e:  # CheckpointException derives from BaseException
        if isinstance(e, KeyboardInterrupt):
            raise
        return "none"
    i = int(sd["step"])
    for k in range(4):
        assert torch.equal(sd[f"t{k}"], torch.full((mib << 18,), float(i * 100 + k))), f"t{k} is not save {i}'s"
    return "whole"


def test_enospc_on_a_small_tmpfs_leaves_nothing_that_loads(tmp_path: Path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    # A private mount namespace: the 8 MiB tmpfs is gone when the child ends.
    cmd = (
        f"mount -t tmpfs -o size=8m none {mnt} && mkdir {mnt}/keep && echo other > {mnt}/keep/file && "
        f"{sys.executable} {script} {mnt}/ckpt 4 1; rc=$?; ls -a {mnt}/ckpt; cat {mnt}/keep/file; exit $rc"
    )
    r = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=120)
    if "mount:" in r.stderr and r.returncode == 32:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    assert r.returncode != 0, r.stdout
    assert "No space left on device" in r.stderr, r.stderr[-2000:]
    listing = r.stdout.split()
    assert ".metadata" not in listing and "__0_0.distcp" not in listing, listing  # partial file removed
    assert "other" in listing  # nothing outside the checkpoint touched


@pytest.mark.parametrize("limit_mib", [1, 5])
def test_failed_write_over_an_old_checkpoint_leaves_one_that_does_not_load(tmp_path: Path, limit_mib: int):
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    ok = run_python(f"import sys; sys.argv = ['x', {str(tmp_path / 'c')!r}, '2', '1']\n" + SAVER)
    assert ok.returncode == 0, ok.stderr
    assert load_outcome(tmp_path / "c", 2) == "whole"
    # The next save of the same directory fails half-way: files may not grow past the limit
    # (RLIMIT_FSIZE: pwrite answers EFBIG; Python ignores SIGXFSZ).
    r = subprocess.run(
        ["prlimit", f"--fsize={limit_mib << 20}", sys.executable, str(script), str(tmp_path / "c"), "2", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0 and "File too large" in r.stderr, r.stderr[-2000:]
    assert load_outcome(tmp_path / "c", 2) == "none"  # never the old metadata over new data


def test_sigkill_at_random_points_never_leaves_a_checkpoint_that_loads_wrong(tmp_path: Path):
    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    rng = random.Random(17)
    outcomes = []
    for trial in range(6):
        path = tmp_path / f"c{trial}"
        p = subprocess.Popen([sys.executable, str(script), str(path), "8", "1000"], stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        p.stdout.readline()  # one save done: the writer is warm
        time.sleep(rng.uniform(0.0, 0.4))
        p.send_signal(signal.SIGKILL)
        p.wait()
        outcomes.append(load_outcome(path, 8))
    assert set(outcomes) <= {"none", "whole"}, outcomes


def many_items() -> dict:
    g = torch.Generator().manual_seed(11)
    sd = {f"w{i}": torch.randn(1000 + 37 * i, generator=g) for i in range(40)}
    sd["big"] = torch.randn(300_000, generator=g)  # straight from its memory, in a later part
    sd["blob"] = io.BytesIO(b"between the parts")
    return sd


def test_a_file_laid_out_in_parts_is_written_while_the_next_is_laid_out(tmp_path: Path, monkeypatch):
    """With parts of a few items, the file is every part's bytes in order (zeros between
    them, up to each block): the stock reader and dcp_to_torch_save read every item, and every
    container is a valid ZIP."""
    from hostreg.torch._checkpoint import parts as _checkpoint  # the file parts: their sizes and writes

    monkeypatch.setattr(_checkpoint, "PART_ITEMS", 3)
    monkeypatch.setattr(_checkpoint, "PART_BYTES", 1)
    calls = []
    write = _checkpoint._FileLayout.write

    def counted(self, fd, threads, flags, stats):
        calls.append((self.start, flags, threading.current_thread().name))
        return write(self, fd, threads, flags, stats)

    monkeypatch.setattr(_checkpoint._FileLayout, "write", counted)
    sd = many_items()
    d = tmp_path / "c"
    dcp.save(sd, storage_writer=ht.FileSystemWriter(d), no_dist=True)
    assert len(calls) == 14  # 42 items, 3 a part
    assert all(start % 4096 == 0 for start, _, _ in calls)
    assert [f for _, f, _ in calls] == [2] * 13 + [1]  # HOSTREG_IO_MORE, then HOSTREG_IO_SYNC for the last
    assert all(name == "hostreg-writer" for _, _, name in calls)
    got = {k: torch.zeros_like(v) for k, v in sd.items() if isinstance(v, torch.Tensor)}
    got["blob"] = io.BytesIO()
    dcp.load(got, storage_reader=dcp.FileSystemReader(str(d)), no_dist=True)
    assert all(torch.equal(got[k], v) for k, v in sd.items() if isinstance(v, torch.Tensor))
    assert got["blob"].getvalue() == b"between the parts"
    for c in containers(d):
        if c[:2] == b"PK":
            assert zipfile.ZipFile(io.BytesIO(c)).testzip() is None
    dcp_to_torch_save(str(d), str(tmp_path / "all.pt"))
    assert torch.equal(
        torch.load(tmp_path / "all.pt", weights_only=False)["big"], sd["big"]
    )  # BytesIO: not weights-only


def test_a_part_that_fails_stops_the_file_and_leaves_no_file_thread_or_descriptor(tmp_path: Path, monkeypatch):
    from hostreg.torch._checkpoint import parts as _checkpoint  # the file parts: their sizes and writes

    monkeypatch.setattr(_checkpoint, "PART_ITEMS", 3)
    monkeypatch.setattr(_checkpoint, "PART_BYTES", 1)
    calls = []
    write = _checkpoint._FileLayout.write

    def failing(self, fd, threads, flags, stats):
        calls.append(self.start)
        if len(calls) == 3:
            raise OSError(28, "No space left on device (injected)")
        return write(self, fd, threads, flags, stats)

    monkeypatch.setattr(_checkpoint._FileLayout, "write", failing)
    fds = len(os.listdir("/proc/self/fd"))
    d = tmp_path / "c"
    with pytest.raises(CheckpointException, match="No space left"):
        dcp.save(many_items(), storage_writer=ht.FileSystemWriter(d), no_dist=True)
    assert len(calls) == 3  # nothing written after the failure
    assert sorted(p.name for p in d.iterdir()) == []  # no partial file, no .metadata
    assert len(os.listdir("/proc/self/fd")) == fds
    assert not [t for t in threading.enumerate() if t.name == "hostreg-writer"]


def test_ctrl_c_while_a_part_is_written_waits_for_it_before_the_file_goes(tmp_path: Path, monkeypatch):
    """An interrupt that reaches the caller while it waits for the writer's thread to write a
    part: the descriptor is closed and the file removed only once that write has ended (a
    write to a closed, maybe reused, descriptor would land in another file)."""
    from hostreg.torch._checkpoint import parts as _checkpoint  # the file parts: their sizes and writes

    monkeypatch.setattr(_checkpoint, "PART_ITEMS", 3)
    monkeypatch.setattr(_checkpoint, "PART_BYTES", 1)
    write = _checkpoint._FileLayout.write
    ended = []

    def slow(self, fd, threads, flags, stats):
        time.sleep(0.3)
        write(self, fd, threads, flags, stats)
        ended.append(time.monotonic())

    join = threading.Thread.join
    interrupted = []

    def join_once_interrupted(self, timeout=None):  # Ctrl-C lands in the caller's wait for the first part
        if self.name == "hostreg-writer" and timeout is not None and not interrupted:
            interrupted.append(1)
            raise KeyboardInterrupt
        return join(self, timeout)

    monkeypatch.setattr(_checkpoint._FileLayout, "write", slow)
    monkeypatch.setattr(threading.Thread, "join", join_once_interrupted)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(CheckpointException, match="KeyboardInterrupt"):  # DCP wraps what its ranks raise
        dcp.save(many_items(), storage_writer=ht.FileSystemWriter(tmp_path / "c"), no_dist=True)
    gone = time.monotonic()
    assert interrupted and len(ended) == 1 and ended[0] <= gone  # the write in flight ended, and well
    assert not [t for t in threading.enumerate() if t.name == "hostreg-writer"]
    assert len(os.listdir("/proc/self/fd")) == fds
    assert not (tmp_path / "c" / "__0_0.distcp").exists()


def test_a_save_over_a_checkpoint_writes_in_place_and_spares_linked_copies(tmp_path: Path):
    """A rank's file of one link is written in place (its blocks are not freed first; the same
    inode, cut to the new size); a file with another link, or a symlink, is replaced by a new
    file, so that a hard-linked copy of the old checkpoint and a symlink's target keep their
    bytes."""
    g = torch.Generator().manual_seed(9)
    old = {"a": torch.randn(4 << 20, generator=g), "b": torch.randn(1000, generator=g)}  # 16 MiB
    new = {"a": torch.randn(1 << 20, generator=g), "b": torch.randn(1000, generator=g)}  # 4 MiB: the file shrinks
    d = tmp_path / "c"
    data = d / "__0_0.distcp"

    def load(path: Path, like: dict) -> dict:
        got = {k: torch.zeros_like(v) for k, v in like.items()}
        dcp.load(got, storage_reader=dcp.FileSystemReader(str(path)), no_dist=True)
        return got

    def same(got: dict, want: dict) -> bool:
        return all(torch.equal(got[k], want[k]) for k in want)

    dcp.save(old, storage_writer=ht.FileSystemWriter(d), no_dist=True)
    ino = data.stat().st_ino
    dcp.save(new, storage_writer=ht.FileSystemWriter(d), no_dist=True)
    assert data.stat().st_ino == ino  # in place
    assert data.stat().st_size < 5 << 20  # cut to the new size
    assert same(load(d, new), new)

    backup = tmp_path / "backup"  # a hard-linked copy of that checkpoint, as `cp -al` makes
    backup.mkdir()
    os.link(data, backup / data.name)
    (backup / ".metadata").write_bytes((d / ".metadata").read_bytes())
    dcp.save(old, storage_writer=ht.FileSystemWriter(d), no_dist=True)
    assert data.stat().st_ino != ino and (backup / data.name).stat().st_ino == ino
    assert same(load(d, old), old)
    assert same(load(backup, new), new)  # the copy kept its bytes

    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"keep me")
    data.unlink()
    data.symlink_to(outside)
    dcp.save(new, storage_writer=ht.FileSystemWriter(d), no_dist=True)
    assert not data.is_symlink() and outside.read_bytes() == b"keep me"
    assert same(load(d, new), new)


def test_stock_checkpoints_of_conjugate_and_negative_views_load_their_values(tmp_path: Path):
    # torch.save keeps the conj / neg bit in _rebuild_tensor_v2's metadata, not in the bytes:
    # such a container is not a plain tensor's and must be read by torch.load (DCP's reader).
    sd = {
        "c": torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj(),
        "n": torch._neg_view(torch.tensor([1.0, -2.0, 3.0])),
    }
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(tmp_path / "s")), no_dist=True)
    out = {"c": torch.zeros(2, dtype=torch.complex64), "n": torch.zeros(3)}
    dcp.load(out, storage_reader=ht.FileSystemReader(tmp_path / "s"), no_dist=True)
    assert torch.equal(out["c"], torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))
    assert torch.equal(out["n"], torch.tensor([-1.0, 2.0, -3.0]))


@pytest.mark.parametrize("bad", [0, 1.5, True, "2"])
def test_thread_count_must_be_a_positive_int(tmp_path: Path, bad):
    with pytest.raises(ValueError, match="thread_count"):
        ht.FileSystemWriter(tmp_path / "w", thread_count=bad)
    with pytest.raises(ValueError, match="thread_count"):
        ht.FileSystemReader(tmp_path, thread_count=bad)


def test_the_default_thread_count_is_chosen_per_disk(tmp_path: Path, monkeypatch):
    from hostreg.torch._checkpoint import files

    dev = os.stat(tmp_path).st_dev
    monkeypatch.setattr(files, "_threads_of", {})
    want = files.SOLID_THREADS
    for q in (
        f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/queue/rotational",
        f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/../queue/rotational",
    ):
        if os.path.exists(q):
            want = files.SPINNING_THREADS if Path(q).read_text().strip() == "1" else files.SOLID_THREADS
            break
    assert files.threads_for(str(tmp_path), None) == want
    assert files.threads_for(str(tmp_path), 3) == 3
    monkeypatch.setattr(files, "_threads_of", {dev: files.SPINNING_THREADS})  # as a rotational disk would have it
    w = ht.FileSystemWriter(tmp_path / "w")
    assert w.thread_count is None
    sd = {"t": torch.arange(1 << 20, dtype=torch.float32)}
    dcp.save(sd, storage_writer=w)
    got = {"t": torch.zeros(1 << 20)}
    dcp.load(got, storage_reader=ht.FileSystemReader(tmp_path / "w"))
    assert torch.equal(got["t"], sd["t"])
