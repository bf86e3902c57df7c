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
