"""hostreg's reader reads small containers a bounded chunk at a time, the next one in the
background (read_chunks.py), and LoadPlanner flattens plain state dicts itself: every kind of
item loads back exactly, with chunks far smaller than the checkpoint, with no thread to read
ahead, and when serving a chunk fails; LoadPlanner's flattening is DCP's (or DCP's runs)."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

import hostreg.torch as ht
from hostreg.torch._checkpoint import read_chunks as _chunks
from hostreg.torch._checkpoint import read_rows as _rows
from hostreg.torch._checkpoint import reader as _reader

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {f"w{i}": torch.randn(17 + i, 5, generator=g) for i in range(40)},
        "big": torch.randn(400_000, generator=g),  # 1.6 MB: past reader.WHOLE, read apart
        "other": torch.randn(64, 48, generator=g),  # loaded into float64: staged, then copied
        "t": torch.randn(30, 20, generator=g),  # loaded into a transposed view: copied
        "step": torch.tensor(3.0),
        "empty": torch.empty(0, 4),
        "lr": 0.25,
        "blob": io.BytesIO(b"bytes item"),
    }


def destination(sd: dict) -> dict:
    out = {"model": {k: torch.full_like(v, 7) for k, v in sd["model"].items()}}
    out |= {"big": torch.zeros(400_000), "other": torch.zeros(64, 48, dtype=torch.float64)}
    out |= {"t": torch.zeros(20, 30).t(), "step": torch.tensor(0.0), "empty": torch.empty(0, 4)}
    return out | {"lr": None, "blob": io.BytesIO()}


def assert_loaded(got: dict, sd: dict) -> None:
    for k, v in sd["model"].items():
        assert torch.equal(got["model"][k], v), k
    for k in ("big", "t", "step", "empty"):
        assert torch.equal(got[k], sd[k]), k
    assert torch.equal(got["other"], sd["other"].double())
    assert got["lr"] == 0.25 and got["blob"].getvalue() == b"bytes item"


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of 3,000 bytes (a container is about 1.5 KiB more than its tensor) and a record
    of the chunks cut (one list per file and path: the rows of an index, the other items) and
    of the buffers mapped."""
    monkeypatch.setattr(_chunks, "CHUNK", 3000)
    seen: dict[str, list] = {"cuts": [], "maps": []}
    cut, mapping = _chunks.cut, _chunks.mmap.mmap

    def spy(lengths):
        got = cut(lengths)
        seen["cuts"].append(got)
        return got

    def mmap(fileno, length, *a, **k):
        seen["maps"].append(length)
        return mapping(fileno, length, *a, **k)

    monkeypatch.setattr(_chunks, "cut", spy)
    monkeypatch.setattr(_chunks.mmap, "mmap", mmap)
    return seen


@pytest.mark.parametrize("writer", ["hostreg", "stock"])
@pytest.mark.parametrize("planner", ["LoadPlanner", "DefaultLoadPlanner"])
def test_every_kind_of_item_loads_from_many_small_chunks(tmp_path: Path, small_chunks, writer: str, planner: str):
    sd = state()
    w = ht.FileSystemWriter(tmp_path) if writer == "hostreg" else dcp.FileSystemWriter(tmp_path)
    dcp.save(sd, storage_writer=w, no_dist=True)
    out = destination(sd)
    p = ht.LoadPlanner() if planner == "LoadPlanner" else DefaultLoadPlanner()
    dcp.load(out, storage_reader=ht.FileSystemReader(tmp_path), planner=p, no_dist=True)
    assert_loaded(out, sd)
    cuts = small_chunks["cuts"]
    # From hostreg's index with its planner, the rows (whole tensors into plain contiguous
    # destinations: the model's and step) are read apart from the other items.
    assert len(cuts) == (2 if writer == "hostreg" and planner == "LoadPlanner" else 1)
    chunks = [c for got in cuts for c in got]
    assert len(chunks) > 20  # every small container, a chunk of about two at a time
    assert sum(b - a for a, b, _ in chunks) == 40 + 5  # the model's, other, t, step, blob; big read apart
    assert len(small_chunks["maps"]) == 2 * len(cuts)  # two buffers for each, alternating
    assert all(n <= 3000 or b - a == 1 for a, b, n in chunks)  # a longer container alone
    assert sorted(small_chunks["maps"]) == sorted(max(n for _, _, n in got) for got in cuts for _ in (0, 1))


def test_with_no_thread_to_read_ahead_the_chunks_are_read_in_turn(tmp_path: Path, small_chunks, monkeypatch):
    class Refused:
        def __init__(self, *a, **k):
            raise RuntimeError("can't start new thread")

    monkeypatch.setattr(_chunks, "ThreadPoolExecutor", Refused)
    sd = state(1)
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), no_dist=True)
    out = destination(sd)
    dcp.load(out, storage_reader=ht.FileSystemReader(tmp_path), planner=ht.LoadPlanner(), no_dist=True)
    assert_loaded(out, sd)


@pytest.mark.parametrize("planner", ["LoadPlanner", "DefaultLoadPlanner"])
def test_a_failure_while_a_chunk_is_served_waits_for_the_read_ahead(
    tmp_path: Path, small_chunks, monkeypatch, planner: str
):
    """The caller's error (here a Ctrl-C while the first chunk is served) reaches it only once
    the next chunk's read, in flight into a buffer about to be freed, has ended; no thread or
    descriptor is left. Both ways of serving a chunk: the rows of an index (LoadPlanner) and
    read items (DCP's planner)."""
    sd = state(2)
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), no_dist=True)
    read = _reader.FileSystemReader._read_array
    ended: list[float] = []

    def slow(self, fd, address, count):
        if threading.current_thread().name.startswith("hostreg-read"):
            time.sleep(0.3)
        read(self, fd, address, count)
        ended.append(time.monotonic())

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(_reader.FileSystemReader, "_read_array", slow)
    if planner == "LoadPlanner":
        monkeypatch.setattr(_rows, "_check_chunk", interrupted)
        p = ht.LoadPlanner()
    else:
        monkeypatch.setattr(_chunks, "serve_whole", interrupted)
        p = DefaultLoadPlanner()
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(BaseException, match="KeyboardInterrupt"):  # DCP may wrap what its ranks raise
        try:
            dcp.load(destination(sd), storage_reader=ht.FileSystemReader(tmp_path), planner=p)
        except KeyboardInterrupt as e:
            raise RuntimeError("KeyboardInterrupt") from e
    gone = time.monotonic()
    assert len(ended) == 2 and ended[1] <= gone  # the first chunk's read, then the one ahead: ended
    assert not [t for t in threading.enumerate() if t.name.startswith("hostreg-read")]
    assert len(os.listdir("/proc/self/fd")) == fds


def _set_up(cls: type, sd: dict) -> tuple:
    p = cls()
    p.set_up_planner(sd, None, True)
    return p.state_dict, p.mappings, p.original_state_dict is sd


T = torch.ones(2)
FLATTENINGS = {
    "nested": {"a": {"b": {"c": T, "d": 1}, "e": T}, "f": "text", "g": None, "h": 2.5, "i": b"raw", "j": True},
    "ordered": {"z": T, "a": {"y": T, "b": T}, "m": T},
    "dotted keys": {"model": {"layer.0.w": T, "x": {"a.b": 1}}, "opt.state": {"": T, "c.": b"raw"}},
    "a list": {"a": [T, T], "b": T},
    "a tuple": {"a": (1, 2), "b": T},
    "an int key": {"a": {0: T, 1: T}},
    "an empty dict": {"a": {}, "b": T},
    "a tensor subclass": {"a": torch.nn.Parameter(torch.ones(2)), "b": T},
    "a bytes buffer": {"a": io.BytesIO(b"x"), "b": T},
}


@pytest.mark.parametrize("name", list(FLATTENINGS))
def test_load_planner_flattens_as_dcp_does(name: str):
    sd = FLATTENINGS[name]
    want, got = _set_up(DefaultLoadPlanner, sd), _set_up(ht.LoadPlanner, sd)
    assert list(got[0].items()) == list(want[0].items())  # the same values (by identity), in DCP's order
    assert got[1] == want[1] and got[2] and want[2]


def test_a_duplicate_flattened_key_is_dcps_error():
    sd = {"a.b": T, "a": {"b": T}}
    for cls in (DefaultLoadPlanner, ht.LoadPlanner):
        with pytest.raises(ValueError, match="duplicated flatten key"):
            _set_up(cls, sd)


def test_a_planner_that_resolves_tensors_its_own_way_is_asked_for_every_item(tmp_path: Path):
    """The reader's shortcut (the state dict's tensor itself as the destination) is taken only
    for planners that resolve tensors as DCP's DefaultLoadPlanner does."""
    sd = {"model": {f"w{i}": torch.full((3,), float(i)) for i in range(5)}}
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), no_dist=True)
    elsewhere = {f"model.w{i}": torch.zeros(3) for i in range(5)}

    class Redirecting(ht.LoadPlanner):
        def resolve_tensor(self, read_item):
            return elsewhere[read_item.dest_index.fqn]

    out = {"model": {k: torch.zeros(3) for k in sd["model"]}}
    dcp.load(out, storage_reader=ht.FileSystemReader(tmp_path), planner=Redirecting(), no_dist=True)
    for i in range(5):
        assert torch.equal(elsewhere[f"model.w{i}"], sd["model"][f"w{i}"])
        assert not out["model"][f"w{i}"].any()


@pytest.mark.parametrize("planner", ["LoadPlanner", "DefaultLoadPlanner"])
@pytest.mark.parametrize("damage", ["descriptor size", "record name", "padding"])
def test_a_container_unlike_its_run_is_served_apart(tmp_path: Path, monkeypatch, damage: str, planner: str):
    """40 containers of one dtype and shape lie back to back: the reader checks them at once
    (the rows of an index: read_rows._compare; read items: read_chunks._check_run). One of them
    changed where that comparison looks (its data descriptor's size, its data record's name in
    the local header, the local header's padding) is not served with the others but handed on
    (then parsed from its central directory, which is intact); every tensor loads back
    exactly."""
    sd = {f"w{i:02d}": torch.randn(64, generator=torch.Generator().manual_seed(i)) for i in range(40)}
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), no_dist=True)
    md = ht.FileSystemReader(tmp_path).read_metadata()
    info = next(v for k, v in md.storage_data.items() if k.fqn == "w20")
    path = tmp_path / info.relative_path
    raw = bytearray(path.read_bytes())
    box = raw[info.offset : info.offset + info.length]
    name = box.index(b"archive/data/0")  # the data record's name, after its local header
    data = name + len("archive/data/0") + int.from_bytes(box[name - 2 : name], "little")
    if damage == "descriptor size":
        at = data + 64 * 4 + 8  # signature, CRC-32, then the compressed size
        box[at : at + 4] = (256 + 1).to_bytes(4, "little")
    elif damage == "record name":
        box[name + len("archive/data/")] = ord("9")
    else:
        assert box[data - 1] == ord("Z")  # the writer pads the data record's extra field with Z
        box[data - 1] = ord("Y")
    raw[info.offset : info.offset + info.length] = box
    path.write_bytes(bytes(raw))
    handed_on: list[int] = []
    rows_left: list[str] = []
    serve, serve_rows = _chunks.serve_whole, _rows.serve_rows

    def spy(buf, base, idx, infos, at, dests):
        rest = serve(buf, base, idx, infos, at, dests)
        handed_on.extend(infos[i].offset for i in rest)
        return rest

    def rows_spy(index, rows, *a):
        left = serve_rows(index, rows, *a)
        rows_left.extend(index.names[r] for r in left)
        return left

    monkeypatch.setattr(_chunks, "serve_whole", spy)
    monkeypatch.setattr(_reader, "serve_rows", rows_spy)
    out = {k: torch.zeros(64) for k in sd}
    p = ht.LoadPlanner() if planner == "LoadPlanner" else DefaultLoadPlanner()
    dcp.load(out, storage_reader=ht.FileSystemReader(tmp_path), planner=p, no_dist=True)
    if planner == "LoadPlanner" and damage == "padding":
        # Then checked alone, by data_offset, which checks what says where the data lies, not
        # the padding's bytes (the comparison of a run takes all bytes before the data).
        assert rows_left == [] and handed_on == []
    elif planner == "LoadPlanner":
        assert rows_left == ["w20"] and handed_on == [info.offset]
    else:
        assert handed_on == [info.offset] and rows_left == []
    for k, v in sd.items():
        assert torch.equal(out[k], v), k
