"""A checkpoint is input: hostreg's reader against files it did not write. A .metadata pickle
that would run code, entries whose files leave the directory, offsets and lengths that are not
byte counts or run past the file, sizes that disagree with the container, truncated and empty
files: each a clear error naming the file or the item, before anything runs or is read from
outside the checkpoint; never a crash, a hang or a state dict reported as loaded."""

from __future__ import annotations

import dataclasses
import io
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata, TensorStorageMetadata

import hostreg.torch as ht
from hostreg.torch._checkpoint.metadata_read import UntrustedMetadataError

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def state() -> dict:
    return {"a": torch.arange(10.0), "b": torch.full((4, 3), 2.0), "n": 5, "blob": io.BytesIO(b"bytes")}


def destination() -> dict:
    return {"a": torch.zeros(10), "b": torch.zeros(4, 3), "n": 0, "blob": io.BytesIO()}


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    dcp.save(state(), storage_writer=ht.FileSystemWriter(path), no_dist=True)
    return path


def metadata(path: Path) -> Metadata:
    with open(path / ".metadata", "rb") as f:
        return pickle.load(f)  # our own file, just written: trusted


def rewrite(path: Path, md: Metadata) -> None:
    with open(path / ".metadata", "wb") as f:
        pickle.dump(md, f)


def load_error(path: Path, **kw) -> str:
    """The text of what hostreg's reader raises loading ``path`` (with its cause); fails the
    test when the load succeeds."""
    try:
        dcp.load(destination(), storage_reader=ht.FileSystemReader(path, **kw), no_dist=True)
    except BaseException as e:  # DCP wraps its ranks' errors in CheckpointException (a BaseException)
        if isinstance(e, KeyboardInterrupt):
            raise
        parts, at = [], e
        while at is not None:
            parts.append(f"{type(at).__name__}: {at}")
            at = at.__cause__ or at.__context__
        return " <- ".join(parts)
    pytest.fail("the load succeeded")


class RunsCode:
    """Pickles as a call of ``open(path, "w")``: unpickling it creates ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_metadata_pickle_that_would_run_code_is_refused_before_it_runs(ckpt: Path, tmp_path: Path):
    marker = tmp_path / "ran"
    md = metadata(ckpt)
    md.planner_data = RunsCode(str(marker))
    rewrite(ckpt, md)
    assert not marker.exists()  # pickling it did not run it
    err = load_error(ckpt)
    assert "names io.open, which DCP's metadata is not made of" in err and "trusted=True" in err, err
    assert not marker.exists()
    # The stock reader and hostreg's with trusted=True unpickle as DCP does: the code runs.
    ht.FileSystemReader(ckpt, trusted=True).read_metadata()
    assert marker.exists()


@pytest.mark.parametrize(
    "content, says",
    [
        (b"", "is empty"),
        (None, "is not a whole pickle"),
        (b"PK\x03\x04 this is a zip, not a pickle", "is not a whole pickle"),
        (pickle.dumps({"state_dict_metadata": {}}), "holds a dict, not DCP's Metadata"),
    ],
    ids=["empty", "truncated", "not a pickle", "another object"],
)
def test_a_damaged_metadata_file_is_an_error_naming_it(ckpt: Path, content: bytes | None, says: str):
    raw = (ckpt / ".metadata").read_bytes()
    (ckpt / ".metadata").write_bytes(raw[: len(raw) // 2] if content is None else content)
    err = load_error(ckpt)
    assert f"{ckpt / '.metadata'} {says}" in err, err
    with pytest.raises(UntrustedMetadataError, match=says):
        ht.FileSystemReader(ckpt).read_metadata()


def _set_storage(md: Metadata, fqn: str, **changes) -> None:
    for index, info in list(md.storage_data.items()):
        if index.fqn == fqn:
            md.storage_data[index] = dataclasses.replace(info, **changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"relative_path": "../outside.distcp"},
        {"relative_path": "/etc/passwd"},
        {"relative_path": "sub/__0_0.distcp"},
        {"relative_path": ".."},
        {"relative_path": ""},
        {"offset": -1},
        {"length": -5},
        {"offset": 1.5},
        {"offset": "0"},
    ],
    ids=lambda c: repr(c),
)
def test_entries_that_leave_the_directory_or_are_not_byte_counts_are_errors_naming_the_item(ckpt: Path, changes):
    md = metadata(ckpt)
    _set_storage(md, "b", **changes)
    rewrite(ckpt, md)
    err = load_error(ckpt)
    assert "ValueError" in err and "b:" in err, err


def test_a_symbolic_link_out_of_the_directory_is_refused(ckpt: Path, tmp_path: Path):
    outside = tmp_path / "outside.distcp"
    outside.write_bytes((ckpt / "__0_0.distcp").read_bytes())
    md = metadata(ckpt)
    _set_storage(md, "a", relative_path="link.distcp")
    rewrite(ckpt, md)
    (ckpt / "link.distcp").symlink_to(outside)
    err = load_error(ckpt)
    assert "ValueError" in err and "link.distcp" in err and "a:" in err, err


@pytest.mark.parametrize("past", [1, 4096, 1 << 40])
def test_an_item_past_the_end_of_its_file_is_an_error(ckpt: Path, past: int):
    md = metadata(ckpt)
    size = (ckpt / "__0_0.distcp").stat().st_size
    info = next(i for k, i in md.storage_data.items() if k.fqn == "b")
    _set_storage(md, "b", offset=size - info.length + past)
    rewrite(ckpt, md)
    err = load_error(ckpt)
    assert "ValueError: b: bytes" in err and "run past the end of __0_0.distcp" in err, err


def test_items_that_overlap_in_their_file_are_an_error_naming_one(ckpt: Path):
    md = metadata(ckpt)
    info = next(i for k, i in md.storage_data.items() if k.fqn == "a")
    _set_storage(md, "b", offset=info.offset + 1)
    rewrite(ckpt, md)
    err = load_error(ckpt)
    assert "overlap" in err and ("ValueError: a:" in err or "ValueError: b:" in err), err


def test_sizes_that_disagree_with_the_container_are_an_error_naming_the_item(ckpt: Path):
    md = metadata(ckpt)
    tmd = md.state_dict_metadata["a"]
    bigger = torch.Size([20])
    md.state_dict_metadata["a"] = TensorStorageMetadata(
        tmd.properties, bigger, [ChunkStorageMetadata(torch.Size([0]), bigger)]
    )
    rewrite(ckpt, md)
    dest = destination() | {"a": torch.zeros(20)}
    with pytest.raises(BaseException, match=r"a: the metadata reads offsets \(0,\), lengths \(20,\)"):
        dcp.load(dest, storage_reader=ht.FileSystemReader(ckpt), planner=ht.LoadPlanner(), no_dist=True)


@pytest.mark.parametrize("keep", [0, 100, "half"])
def test_a_truncated_or_empty_data_file_is_an_error(ckpt: Path, keep):
    data = ckpt / "__0_0.distcp"
    raw = data.read_bytes()
    data.write_bytes(raw[: len(raw) // 2] if keep == "half" else raw[:keep])
    err = load_error(ckpt)
    assert "OSError" in err or "ValueError" in err, err


def test_a_missing_data_file_is_an_error_naming_it(ckpt: Path):
    os.unlink(ckpt / "__0_0.distcp")
    err = load_error(ckpt)
    assert "__0_0.distcp" in err, err


def test_the_untouched_checkpoint_loads(ckpt: Path):
    out = destination()
    dcp.load(out, storage_reader=ht.FileSystemReader(ckpt), no_dist=True)
    want = state()
    assert torch.equal(out["a"], want["a"]) and torch.equal(out["b"], want["b"]) and out["n"] == 5
    assert out["blob"].getvalue() == b"bytes"


def test_a_checkpoint_with_the_older_tensor_properties_loads_untrusted(tmp_path: Path):
    """Checkpoints of older torch name ``TensorProperties`` of ``torch.distributed._shard``
    (PyTorch's test_compatibility.py keeps loading them): written so here, loaded exactly."""
    from unittest.mock import patch

    from torch.distributed._shard.sharded_tensor.metadata import TensorProperties

    want = {
        "a": torch.arange(16.0).reshape(4, 4),
        "h": torch.ones(3, dtype=torch.float16).to(memory_format=torch.contiguous_format),
    }
    with patch("torch.distributed.checkpoint.metadata.TensorProperties", TensorProperties):
        dcp.save(want, storage_writer=dcp.FileSystemWriter(tmp_path), no_dist=True)
    assert b"torch.distributed._shard.sharded_tensor.metadata" in (tmp_path / ".metadata").read_bytes()
    out = {"a": torch.zeros(4, 4), "h": torch.zeros(3, dtype=torch.float16)}
    dcp.load(out, storage_reader=ht.FileSystemReader(tmp_path), no_dist=True)
    assert torch.equal(out["a"], want["a"]) and torch.equal(out["h"], want["h"])
    props = ht.FileSystemReader(tmp_path).read_metadata().state_dict_metadata["h"].properties
    assert type(props) is TensorProperties and props.dtype == torch.float16


def _getattr_pickle(module: str, cls: str, name: str) -> bytes:
    """A pickle of ``getattr(module.cls, name)``, as Python 3.11.2 pickles an enum member."""
    return (
        b"\x80\x02cbuiltins\ngetattr\nc"
        + f"{module}\n{cls}\n".encode()
        + b"X"
        + len(name).to_bytes(4, "little")
        + name.encode()
        + b"\x86R."
    )


def test_an_enum_member_by_name_loads_and_nothing_else_does():
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from hostreg.torch._checkpoint.metadata_read import MetadataUnpickler

    def load(raw: bytes):
        return MetadataUnpickler(io.BytesIO(raw), "x").load()

    mod = "torch.distributed.checkpoint.metadata"
    assert (
        load(_getattr_pickle(mod, "_MEM_FORMAT_ENCODING", "TORCH_CHANNELS_LAST"))
        is _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST
    )
    for cls, name in [("Metadata", "__init__"), ("_MEM_FORMAT_ENCODING", "__class__"), ("_MEM_FORMAT_ENCODING", "mro")]:
        with pytest.raises(UntrustedMetadataError):
            load(_getattr_pickle(mod, cls, name))


def test_a_bytes_item_that_would_run_code_is_refused_before_it_runs(tmp_path: Path):
    """DCP's planners torch.load bytes items with weights_only=False: the reader first holds
    them to weights_only=True (not trusted)."""
    marker = tmp_path / "ran"
    path = tmp_path / "c"
    dcp.save(
        {"a": torch.ones(3), "step": RunsCode(str(marker))}, storage_writer=ht.FileSystemWriter(path), no_dist=True
    )
    assert not marker.exists()  # pickling it ran nothing
    dest = {"a": torch.zeros(3), "step": 0}
    with pytest.raises(BaseException, match="step: its bytes item holds what torch.load"):
        dcp.load(dest, storage_reader=ht.FileSystemReader(path), planner=ht.LoadPlanner(), no_dist=True)
    assert not marker.exists()
    out = destination()
    dcp.load(out, storage_reader=ht.FileSystemReader(ckpt_of(tmp_path)), no_dist=True)  # BytesIO, ints: admitted
    assert out["blob"].getvalue() == b"bytes" and out["n"] == 5


def ckpt_of(tmp_path: Path) -> Path:
    path = tmp_path / "plain"
    dcp.save(state(), storage_writer=ht.FileSystemWriter(path), no_dist=True)
    return path


HOSTILE_CONTAINER = textwrap.dedent(
    """
    import collections, dataclasses, io, os, pickle, struct, sys, warnings, zipfile
    import torch, torch.distributed.checkpoint as dcp, hostreg.torch as ht
    warnings.filterwarnings("ignore")
    path = sys.argv[1]
    # A ZIP whose data.pkl puts the tensor 1e9 elements into its storage, and whose central
    # directory says data/0 holds 4 GB: it lies far past the container.
    class St: pass
    class T:
        def __reduce__(self):
            return (torch._utils._rebuild_tensor_v2, (St(), 10**9 - 16, (16,), (1,), False, collections.OrderedDict()))
    class P(pickle.Pickler):
        def persistent_id(self, o):
            return ("storage", torch.FloatStorage, "0", "cpu", 10**9) if isinstance(o, St) else None
    pk = io.BytesIO(); P(pk, protocol=2).dump(T())
    zb = io.BytesIO()
    with zipfile.ZipFile(zb, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", pk.getvalue())
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", b"\\0" * 64)
        z.writestr("archive/version", "3\\n")
    b = bytearray(zb.getvalue())
    cd = b.find(b"archive/data/0", b.find(b"PK\\x01\\x02")) - 46
    struct.pack_into("<II", b, cd + 20, 0xFFFFFFF0, 0xFFFFFFF0)
    dcp.save({"w": torch.arange(16.0)}, storage_writer=ht.FileSystemWriter(path), no_dist=True)
    md = pickle.load(open(os.path.join(path, ".metadata"), "rb"))
    (k, info), = md.storage_data.items()
    open(os.path.join(path, info.relative_path), "wb").write(bytes(b))
    md.storage_data = {k: dataclasses.replace(info, offset=0, length=len(b))}
    pickle.dump(md, open(os.path.join(path, ".metadata"), "wb"))
    try:
        dcp.load({"w": torch.zeros(16)}, storage_reader=ht.FileSystemReader(path), planner=ht.LoadPlanner(), no_dist=True)
    except BaseException as e:
        print("refused", type(e).__name__)
    else:
        print("loaded")
    """
)


def test_a_container_whose_tensor_lies_past_it_is_an_error_not_a_crash(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-c", HOSTILE_CONTAINER, str(tmp_path / "c")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and "refused" in r.stdout, f"exit {r.returncode}: {r.stdout} {r.stderr[-2000:]}"


def test_a_fifo_in_place_of_a_data_file_is_refused_not_waited_for(ckpt: Path):
    data = ckpt / "__0_0.distcp"
    data.unlink()
    os.mkfifo(data)
    err = load_error(ckpt)  # never opened: a FIFO would block the open
    assert "ValueError" in err and "is not a file of" in err, err


def test_a_pickle_that_sets_attributes_of_an_allowed_class_is_refused_and_undone(ckpt: Path):
    from torch.distributed.checkpoint.metadata import Metadata

    init = Metadata.__init__
    legit = pickle.dumps(metadata(ckpt), protocol=2)
    evil = (
        (
            b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n"
            b"N}X\x08\x00\x00\x00__init__ctorch\nSize\ns\x86b0"  # BUILD (None, {"__init__": torch.Size}) on the class
        )
        + legit[2:]
    )
    (ckpt / ".metadata").write_bytes(evil)
    err = load_error(ckpt)
    assert "sets attributes of" in err, err
    assert Metadata.__init__ is init


def test_a_checkpoint_of_the_old_flattening_is_planned_as_dcp_plans_it(tmp_path: Path):
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    path = tmp_path / "c"
    dcp.save({"w": torch.ones(2), "opt": 5, "opt.lr": 0.1}, storage_writer=ht.FileSystemWriter(path), no_dist=True)
    got = []
    for planner in (DefaultLoadPlanner(), ht.LoadPlanner()):
        dest = {"w": torch.zeros(2), "opt": {"lr": 0.0}}
        dcp.load(dest, storage_reader=ht.FileSystemReader(path), planner=planner, no_dist=True)
        got.append(dest["opt"])
    assert got[0] == got[1]
