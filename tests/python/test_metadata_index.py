"""The index hostreg's writer puts inside .metadata (index.py): the Metadata hostreg's reader
makes from it is the one the pickle holds, entry for entry, at a first save, a repeated save
whose bytes items moved, and a save planned by DCP's own planner; DCP's reader still reads the
file; a load from it gives every value back through hostreg's and DCP's readers and planners;
its plan is DCP's plan; metadata the columns cannot say gets no index; a damaged or hostile
index is not trusted over the pickle."""

from __future__ import annotations

import io
import pickle
import struct
import zlib
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

import hostreg.torch as ht
from hostreg.torch._checkpoint import index as _index
from hostreg.torch._checkpoint.load_planner import RowItems
from hostreg.torch._checkpoint.metadata_read import _TRAILER, split_trailer

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def state(lr: float = 0.1) -> dict:
    g = torch.Generator().manual_seed(3)
    return {
        "model": {
            f"layer{i}": {"w": torch.randn(4, i + 1, generator=g), "b": torch.randn(i + 1, generator=g)}
            for i in range(6)
        },
        "half": torch.randn(7, 3, generator=g).to(torch.bfloat16),
        "grad": torch.randn(5, generator=g).requires_grad_(),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "big": torch.randn(400_000, generator=g),  # past the reader's whole-container size
        "optim": {
            "step": torch.tensor(3.0),
            "param_groups": [{"lr": lr, "params": [0, 1], "name": "x" * int(lr * 100)}],
        },
        "blob": io.BytesIO(b"some bytes"),
    }


def zeros_like(sd):
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [zeros_like(v) for v in sd]
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd.detach())
    if isinstance(sd, io.BytesIO):
        return io.BytesIO()
    return type(sd)() if isinstance(sd, (int, float, str)) else sd


def equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(equal, a, b))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a.detach(), b.detach())
    if isinstance(a, io.BytesIO):
        return a.getvalue() == b.getvalue()
    return a == b


def same_metadata(path: Path) -> None:
    """hostreg's reader took the index, and what it made equals the pickle, entry for entry."""
    mine = ht.FileSystemReader(path).read_metadata()
    stock = dcp.FileSystemReader(path).read_metadata()
    assert isinstance(mine.state_dict_metadata, _index.Entries)
    assert dict(mine.state_dict_metadata) == stock.state_dict_metadata and len(stock.state_dict_metadata) > 10
    assert dict(mine.storage_data) == stock.storage_data == dict(mine.storage_data.items())
    assert len(mine.storage_data.items()) == len(stock.storage_data)
    assert all(mine.storage_data[k] == v for k, v in stock.storage_data.items())
    assert dict(mine.planner_data) == stock.planner_data
    assert (mine.version, mine.storage_meta.save_id) == (stock.version, stock.storage_meta.save_id)


def loads_back(path: Path, sd: dict) -> None:
    for reader, planner in [
        (ht.FileSystemReader(path), ht.LoadPlanner()),
        (ht.FileSystemReader(path), DefaultLoadPlanner()),
        (dcp.FileSystemReader(path), ht.LoadPlanner()),
        (dcp.FileSystemReader(path), None),
    ]:
        dest = zeros_like(sd)
        dcp.load(dest, storage_reader=reader, planner=planner, no_dist=True)
        assert equal(dest, sd), (type(reader), type(planner))


@pytest.mark.parametrize("planner", ["hostreg", "dcp"])
def test_the_index_is_the_pickle_and_loads_back(tmp_path: Path, planner: str):
    ht.clear_plan_cache()
    for lr in (0.1, 0.25, 0.25):  # a repeated save whose bytes items grew (the patch), then the same
        sd = state(lr)
        dcp.save(
            sd,
            storage_writer=ht.FileSystemWriter(tmp_path),
            planner=ht.SavePlanner() if planner == "hostreg" else None,
            no_dist=True,
        )
        same_metadata(tmp_path)
        loads_back(tmp_path, sd)


def test_the_plan_from_the_index_is_dcps(tmp_path: Path):
    sd = state()
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), planner=ht.SavePlanner(), no_dist=True)
    dest = zeros_like(sd)
    plans = []
    for reader, cls in [(ht.FileSystemReader, ht.LoadPlanner), (dcp.FileSystemReader, DefaultLoadPlanner)]:
        p = cls()
        p.set_up_planner(dest, reader(tmp_path).read_metadata(), True)
        plans.append(p.create_local_plan().items)
    got, want = plans
    assert isinstance(got, RowItems) and sum(type(s) is int for s in got.slots) >= 12  # whole tensors: rows
    assert list(got) == list(want) and got == want
    assert pickle.loads(pickle.dumps(got)) == want  # to other ranks: a list of DCP's ReadItems


def test_metadata_the_columns_cannot_say_gets_no_index(tmp_path: Path):
    sd = {"a\0b": torch.arange(4.0), "c": torch.ones(3)}  # a NUL in a name
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), no_dist=True)
    raw = (tmp_path / ".metadata").read_bytes()
    assert _index.find(raw, split_trailer(raw)[0]) is None
    md = ht.FileSystemReader(tmp_path).read_metadata()
    assert type(md.state_dict_metadata) is dict
    dest = {"a\0b": torch.zeros(4), "c": torch.zeros(3)}
    dcp.load(dest, storage_reader=ht.FileSystemReader(tmp_path), planner=ht.LoadPlanner(), no_dist=True)
    assert equal(dest, sd)


def rewrite_index(path: Path, change) -> None:
    """.metadata with its index's bytes changed by ``change`` (same length), the trailer's CRC
    made to match: what a writer with a bug, or a forger, would leave."""
    raw = bytearray((path / ".metadata").read_bytes())
    n, intact = split_trailer(bytes(raw))
    assert intact
    view = _index.find(bytes(raw), n)
    start = n - 3 - len(view)
    raw[start : n - 3] = change(bytes(view))
    raw[n:] = _TRAILER.pack(b"HRMD", zlib.crc32(raw[:n]), n, b"HRMD")
    (path / ".metadata").write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage",
    [
        "header",  # section lengths that do not add up
        "counts",  # a count that differs from the columns
        "dtype",  # a dtype name that is not torch's
        "negative",  # a negative offset
    ],
)
def test_a_damaged_index_is_not_trusted_over_the_pickle(tmp_path: Path, damage: str):
    sd = state()
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), planner=ht.SavePlanner(), no_dist=True)
    head = _index._HEADER

    def change(view: bytes) -> bytes:
        b = bytearray(view)
        at = len(b) - _index._FOOTER.size - head.size
        h = list(head.unpack_from(b, at))
        if damage == "header":
            h[0] += 8
        elif damage == "counts":
            h[11] += 1
        elif damage == "dtype":
            names_len = h[0]
            i = b.index(b"float32", names_len)
            b[i : i + 7] = b"getattr"
        elif damage == "negative":
            stor = sum(h[:6])
            struct.pack_into("<q", b, stor + 8, -4096)  # the first chunk's offset
        head.pack_into(b, at, *h)
        return bytes(b)

    rewrite_index(tmp_path, change)
    raw = (tmp_path / ".metadata").read_bytes()
    with pytest.raises(_index.BadIndex):
        _index.Index(_index.find(raw, split_trailer(raw)[0]), "x").metadata()
    md = ht.FileSystemReader(tmp_path).read_metadata()
    assert type(md.state_dict_metadata) is dict  # the pickle's, unpickled as data
    loads_back(tmp_path, sd)


def test_hostregs_reader_reads_the_rows_without_making_their_read_items(tmp_path: Path, monkeypatch):
    sd = state()
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), planner=ht.SavePlanner(), no_dist=True)
    made: list[str] = []
    real = RowItems._item

    def spy(self, slot):
        if type(slot) is int:
            made.append(self.metadata_index.names[slot])
        return real(self, slot)

    monkeypatch.setattr(RowItems, "_item", spy)
    dest = zeros_like(sd)
    dcp.load(dest, storage_reader=ht.FileSystemReader(tmp_path), planner=ht.LoadPlanner(), no_dist=True)
    assert equal(dest, sd)
    assert made == ["big"]  # only the container read in two steps (past the whole-read size) asks for its item


def test_an_index_naming_a_file_outside_the_checkpoint_is_refused(tmp_path: Path):
    sd = state()
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), planner=ht.SavePlanner(), no_dist=True)
    rewrite_index(tmp_path, lambda view: view.replace(b"__0_0.distcp\0", b"../0_0.distc\0"))
    md = ht.FileSystemReader(tmp_path).read_metadata()
    assert isinstance(md.storage_data, _index.Storage)  # the index itself holds together
    with pytest.raises(BaseException, match=r"names file .\.\./0_0\.distc., which is not a file of it"):
        dcp.load(zeros_like(sd), storage_reader=ht.FileSystemReader(tmp_path), planner=ht.LoadPlanner(), no_dist=True)


def test_storage_the_columns_cannot_hold_gets_no_index(tmp_path: Path):
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    dcp.save({"a": torch.ones(3)}, storage_writer=ht.FileSystemWriter(tmp_path), no_dist=True)
    md = dcp.FileSystemReader(tmp_path).read_metadata()
    assert _index.build(md) is not None
    (key, info), *_ = md.storage_data.items()
    for bad in [
        _StorageInfo(info.relative_path, 1.5, info.length),  # not a byte count
        _StorageInfo(info.relative_path, 1 << 64, info.length),  # past int64
        _StorageInfo(info.relative_path, info.offset, info.length, ["stream.rot13"]),  # a stream transform
    ]:
        md.storage_data = {key: bad}
        assert _index.build(md) is None


def test_a_truncated_file_is_an_error_naming_the_row_past_its_end(tmp_path: Path):
    """The rows of the index (read_rows.py) are checked against their file's size as the read
    items are: a file cut short names the tensor whose bytes run past its end."""
    sd = {f"w{i}": torch.randn(64, generator=torch.Generator().manual_seed(i)) for i in range(20)}
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), planner=ht.SavePlanner(), no_dist=True)
    md = ht.FileSystemReader(tmp_path).read_metadata()
    assert isinstance(md.storage_data, _index.Storage)
    key, info = max(md.storage_data.items(), key=lambda kv: kv[1].offset)
    path = tmp_path / info.relative_path
    with open(path, "r+b") as f:
        f.truncate(info.offset + info.length - 1)
    dest = {k: torch.zeros(64) for k in sd}
    with pytest.raises(
        BaseException, match=rf"{key.fqn}: bytes {info.offset} to {info.offset + info.length} .*run past"
    ):
        try:
            dcp.load(dest, storage_reader=ht.FileSystemReader(tmp_path), planner=ht.LoadPlanner(), no_dist=True)
        except Exception as e:  # DCP may wrap what its ranks raise
            raise RuntimeError(str(e)) from e


def _set_chunk(view: bytes, chunk: int, file: int, offset: int, length: int) -> bytes:
    """The index ``view`` with chunk ``chunk``'s storage set (file, offset, length): in the
    storage columns, or where the patch gives it (a bytes item's), in the patch's entry (its
    file then numbers the patch's files)."""
    idx = bytearray(view)
    lens = struct.unpack_from("<13Q", idx, len(idx) - struct.calcsize("<Q4s") - struct.calcsize("<13Q"))
    at = sum(lens[:6]) + 24 * chunk
    if struct.unpack_from("<q", idx, at)[0] != -1:
        struct.pack_into("<3q", idx, at, file, offset, length)
        return bytes(idx)
    patch = sum(lens[:9])
    for e in range(lens[9] // 32):
        if struct.unpack_from("<q", idx, patch + 32 * e)[0] == chunk:
            struct.pack_into("<3q", idx, patch + 32 * e + 8, 0, offset, length)
            return bytes(idx)
    raise AssertionError(f"chunk {chunk} is in neither the columns nor the patch")


@pytest.mark.parametrize("alias", ["another row, by the file's second name", "a bytes item"])
def test_rows_that_overlap_other_items_of_their_file_are_an_error(tmp_path: Path, alias: str):
    """The index lists a file's name twice (its own files, then the patch's); a row sent to
    another row's container through the second, or a bytes item sent to a row's container, is
    found overlapping as DCP's items are (by file name, rows and items together), not loaded."""
    sd = {f"w{i:02d}": torch.randn(16, 16, generator=torch.Generator().manual_seed(i)) for i in range(12)}
    sd["s"] = 7
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), planner=ht.SavePlanner(), no_dist=True)
    ix = ht.FileSystemReader(tmp_path).read_metadata().storage_data.index
    assert ix.files == [ix.files[0]] * 2  # the base files, then the patch's: the same name
    target = ix.first_chunk[ix.row["w05"]]
    moved = ix.first_chunk[ix.row["w01" if alias.startswith("another") else "s"]]
    rewrite_index(tmp_path, lambda v: _set_chunk(v, moved, 1, ix.offset[target], ix.length[target]))
    for planner in (ht.LoadPlanner(), DefaultLoadPlanner()):
        dest = {k: torch.zeros(16, 16) for k in sd if k != "s"} | {"s": 0}
        with pytest.raises(BaseException, match="overlap another item's"):
            try:
                dcp.load(dest, storage_reader=ht.FileSystemReader(tmp_path), planner=planner, no_dist=True)
            except Exception as e:  # DCP may wrap what its ranks raise
                raise RuntimeError(str(e)) from e


def test_a_checkpoint_of_an_empty_state_dict_loads_as_dcps_does(tmp_path: Path):
    """An index with no entries: a strict load of a tensor is DCP's missing-key error, a
    partial load leaves it as it was."""
    dcp.save({}, storage_writer=ht.FileSystemWriter(tmp_path), planner=ht.SavePlanner(), no_dist=True)
    with pytest.raises(BaseException, match="Missing key in checkpoint state_dict: a"):
        dcp.load(
            {"a": torch.zeros(3)}, storage_reader=ht.FileSystemReader(tmp_path), planner=ht.LoadPlanner(), no_dist=True
        )
    dest = {"a": torch.ones(3)}
    planner = ht.LoadPlanner(allow_partial_load=True)
    dcp.load(dest, storage_reader=ht.FileSystemReader(tmp_path), planner=planner, no_dist=True)
    assert torch.equal(dest["a"], torch.ones(3))
