"""The pickle of .metadata written from templates (metadata_pickle.py): it loads, with pickle,
DCP's reader and hostreg's restricted reader, as the same Metadata that pickle.dumps of it
loads as, field by field and type by type, for metadata of every shape (a property test over
sizes, chunk counts, dtypes, ints of every width, names, paths, storage entries with and
without transforms, fields torch may add); a torch whose classes pickle otherwise gets
pickle.dumps itself; a whole save written this way loads back every value through DCP's reader."""

from __future__ import annotations

import io
import pickle
import string
from pathlib import Path

import hypothesis.strategies as st
import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import HealthCheck, given, settings
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

import hostreg.torch as ht
from hostreg.torch._checkpoint import metadata_pickle as mp
from hostreg.torch._checkpoint.metadata_read import MetadataUnpickler

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def same(a, b) -> bool:
    """Equal in type and value all the way down: containers item by item in order, objects by
    their attributes (MetadataIndex's ``==`` ignores ``index``; this does not)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a.items(), b.items()))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return same(dict(sorted(vars(a).items())), dict(sorted(vars(b).items())))
    return bool(a == b)


def loads_as_pickle_does(md: Metadata) -> bytes:
    raw = mp._write(md)  # the templates, with no fallback to pickle.dumps
    assert mp.dumps(md) == raw
    assert same(pickle.loads(raw), pickle.loads(pickle.dumps(md, protocol=4)))
    return raw


INTS = st.one_of(
    st.integers(0, 300),
    st.integers(0, 70_000),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**80), 2**80),
)
DTYPES = st.sampled_from([torch.float32, torch.bfloat16, torch.int8, torch.bool, torch.complex64, torch.float8_e4m3fn])
NAMES = st.one_of(
    st.text(string.ascii_letters + "._", min_size=1, max_size=12),
    st.text(min_size=0, max_size=300),
    st.sampled_from(["a" * 255, "b" * 256, "\u00e9" * 128, "\ud800"]),  # SHORT_BINUNICODE's edge; a lone surrogate
)


@st.composite
def tensor_md(draw) -> TensorStorageMetadata:
    ndim = draw(st.integers(0, 5))
    size = torch.Size(draw(st.lists(st.integers(0, 2**40), min_size=ndim, max_size=ndim)))
    props = TensorProperties(
        dtype=draw(DTYPES),
        requires_grad=draw(st.booleans()),
        pin_memory=draw(st.booleans()),
        memory_format=draw(st.sampled_from([torch.contiguous_format, torch.channels_last, torch.preserve_format])),
    )
    chunks = [
        ChunkStorageMetadata(
            torch.Size(draw(st.lists(INTS, min_size=ndim, max_size=ndim))),
            torch.Size(draw(st.lists(INTS, min_size=ndim, max_size=ndim))),
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    return TensorStorageMetadata(props, size, chunks)


@st.composite
def metadata(draw) -> Metadata:
    fqns = draw(st.lists(NAMES, max_size=12, unique=True))
    sdm, storage, planner = {}, {}, {}
    files = draw(st.lists(NAMES, min_size=1, max_size=3))
    for fqn in fqns:
        md = draw(st.one_of(tensor_md(), st.just(BytesStorageMetadata())))
        sdm[fqn] = md
        offsets = [c.offsets for c in md.chunks] if isinstance(md, TensorStorageMetadata) else [None]
        for i, off in enumerate(offsets):
            info = _StorageInfo(draw(st.sampled_from(files)), draw(INTS), draw(INTS))
            if draw(st.booleans()):
                info.transform_descriptors = draw(st.sampled_from([[], ["stream.zstd"], ("a", "b")]))
            storage[MetadataIndex(fqn, off, draw(st.sampled_from([i, None])))] = info
        planner[fqn] = tuple(draw(st.lists(st.one_of(NAMES, st.integers(0, 9)), min_size=1, max_size=6)))
    m = Metadata(state_dict_metadata=sdm, planner_data=draw(st.sampled_from([planner, None])), storage_data=storage)
    if draw(st.booleans()):
        m.storage_meta = StorageMeta(checkpoint_id="/x", save_id="1", load_id="2")
        m.version = "1.0.0"
    return m


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(metadata())
def test_any_metadata_loads_as_pickle_dumps_of_it_loads(md: Metadata) -> None:
    assert mp._verified()
    loads_as_pickle_does(md)


def test_memo_holds_only_globals_and_keys_and_equal_objects_load_apart() -> None:
    """Two items with the same properties and size load as objects of their own, as pickle's
    do for objects that were not shared (no object of one item is an object of another)."""
    props = TensorProperties(dtype=torch.float32)
    md = Metadata(
        state_dict_metadata={
            f"t{i}": TensorStorageMetadata(
                props if i else TensorProperties(dtype=torch.float32),
                torch.Size([4]),
                [ChunkStorageMetadata(torch.Size([0]), torch.Size([4]))],
            )
            for i in range(3)
        },
        storage_data={MetadataIndex(f"t{i}", [0], 0): _StorageInfo("__0_0.distcp", 64 * i, 16) for i in range(3)},
    )
    got = pickle.loads(loads_as_pickle_does(md)).state_dict_metadata
    assert got["t0"].properties is not got["t1"].properties is not got["t2"].properties
    assert got["t0"].chunks[0] is not got["t1"].chunks[0]


@pytest.mark.parametrize("changed", ["_StorageInfo state", "TensorProperties state"])
def test_a_torch_whose_classes_pickle_otherwise_gets_pickle_dumps(
    monkeypatch: pytest.MonkeyPatch, changed: str
) -> None:
    """The check against pickle.dumps has teeth: a _StorageInfo whose state is not the one the
    writer writes (its __getstate__ keeps None values too), or a TensorProperties whose state
    holds more than the writer's cache is keyed by, fails it, and dumps is pickle.dumps byte
    for byte."""
    md = mp._sample()
    assert mp._verified()
    assert mp.dumps(md) != pickle.dumps(md, protocol=4)
    monkeypatch.setattr(mp, "_checked", None)
    if changed == "_StorageInfo state":
        monkeypatch.setattr(_StorageInfo, "__getstate__", lambda self: dict(self.__dict__))
    else:
        get, put = TensorProperties.__getstate__, TensorProperties.__setstate__

        def setstate(self, state):  # a torch whose properties carry one more field, loaded as such
            put(self, state[:-1])
            self.another = state[-1]

        monkeypatch.setattr(TensorProperties, "__getstate__", lambda self: (*get(self), "another field"))
        monkeypatch.setattr(TensorProperties, "__setstate__", setstate)
    assert not mp._verified()
    assert mp.dumps(md) == pickle.dumps(md, protocol=4)


def test_what_cannot_be_pickled_raises_as_pickle_dumps_does() -> None:
    md = mp._sample()
    md.other = lambda: None  # type: ignore[attr-defined]
    with pytest.raises((pickle.PicklingError, AttributeError)) as got:
        mp.dumps(md)
    with pytest.raises(type(got.value)):
        pickle.dumps(md, protocol=4)


def test_hostregs_restricted_reader_loads_it() -> None:
    md = mp._sample()
    raw = mp.dumps(md)
    got = MetadataUnpickler(io.BytesIO(raw), "sample").load()
    assert same(got, pickle.loads(pickle.dumps(md, protocol=4)))


def test_a_save_of_many_shapes_loads_back_through_dcps_reader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(5)
    sd = {
        "model": {
            f"l{i}.w": torch.randn(i % 4 + 1, 3, generator=g).to([torch.float32, torch.bfloat16][i % 2])
            for i in range(300)
        },
        "optim": {
            "state": {
                f"l{i}.w": {"exp_avg": torch.randn(i % 4 + 1, 3, generator=g), "step": torch.tensor(float(i))}
                for i in range(300)
            }
        },
        "extra": {"lr": 0.5, "name": "é" * 300},
    }
    written, real = [], mp._write
    monkeypatch.setattr(mp, "_write", lambda m: written.append(len(m.state_dict_metadata)) or real(m))
    ht.clear_plan_cache()
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path), planner=ht.SavePlanner())
    assert written == [902]  # the whole Metadata, by the templates
    raw = (tmp_path / ".metadata").read_bytes()
    stock = dcp.FileSystemReader(tmp_path).read_metadata()
    assert len(stock.state_dict_metadata) == 902
    back = {
        "model": {k: torch.zeros_like(v) for k, v in sd["model"].items()},
        "optim": {
            "state": {k: {n: torch.zeros_like(t) for n, t in v.items()} for k, v in sd["optim"]["state"].items()}
        },
        "extra": {"lr": 0.0, "name": ""},
    }
    dcp.load(back, storage_reader=dcp.FileSystemReader(tmp_path))
    for k, v in sd["model"].items():
        assert torch.equal(back["model"][k], v), k
    for k, v in sd["optim"]["state"].items():
        assert all(torch.equal(back["optim"]["state"][k][n], t) for n, t in v.items()), k
    assert back["extra"] == sd["extra"]
    assert raw.startswith(b"\x80\x04\x95")  # framed from its first opcode, as pickle frames
