"""hostreg's FileSystemWriter and FileSystemReader take DCP's arguments in DCP's order and
are DCP's classes (subclasses): a call written for DCP's classes means the same with
hostreg's. Stream transforms (``_extensions``) and formats other than torch.save make the save
DCP's own writer's; the reader hands items with transforms to DCP's reader with the registry
it was given, so every checkpoint the stock reader reads, hostreg's reads."""

from __future__ import annotations

import inspect
import io
from pathlib import Path
from typing import IO, Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import AsyncStager

import hostreg.torch as ht

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

ext = pytest.importorskip("torch.distributed.checkpoint._extension")


class Xor(ext.StreamTransformExtension):
    """A stream transform for the test: every byte XOR 0x5A (its own inverse). Implements
    DCP's StreamTransformExtension as torch 2.13's _extension.py defines it."""

    @staticmethod
    def registry_name() -> str:
        return "stream.test_xor"

    @staticmethod
    def from_descriptor(version: str) -> Xor:
        assert version == "1"
        return Xor()

    def get_descriptor(self) -> str:
        return f"{self.registry_name()}/1"

    def transform_to(self, output: IO[bytes]) -> IO[bytes]:
        class Writer(io.RawIOBase):
            def writable(self) -> bool:
                return True

            def write(self, b) -> int:
                output.write(bytes(x ^ 0x5A for x in bytes(b)))
                return len(b)

        return Writer()

    def transform_from(self, input: IO[bytes]) -> IO[bytes]:
        return io.BytesIO(bytes(x ^ 0x5A for x in input.read()))


def registry() -> ext.ExtensionRegistry:
    r = ext.ExtensionRegistry()
    r.register(Xor)
    return r


def state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g), "step": torch.tensor(7)}


def zeros_like(sd: dict) -> dict:
    return {k: torch.zeros_like(v) for k, v in sd.items()}


def assert_same(got: dict, want: dict) -> None:
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_the_writers_positions_are_dcps():
    """Every parameter of DCP's writer, in its order, then hostreg's keyword-only ones."""
    ours = list(inspect.signature(ht.FileSystemWriter.__init__).parameters.values())
    stock = [p.name for p in inspect.signature(dcp.FileSystemWriter.__init__).parameters.values()]
    stock = [n for n in stock if n not in ("args", "kwargs")]
    assert [p.name for p in ours[: len(stock)]] == stock
    assert all(p.kind is p.KEYWORD_ONLY for p in ours[len(stock) :])
    w = ht.FileSystemWriter("ck", True, True, 1, 10_000_000)  # DCP's fifth position: per_thread_copy_ahead
    assert (w.thread_count, w.per_thread_copy_ahead, w.overwrite) == (1, 10_000_000, True)
    assert isinstance(w, dcp.FileSystemWriter) and isinstance(w, AsyncStager) and w.fs is not None
    ours_r = list(inspect.signature(ht.FileSystemReader.__init__).parameters.values())
    stock_r = [p.name for p in inspect.signature(dcp.FileSystemReader.__init__).parameters.values()]
    assert [p.name for p in ours_r[: len(stock_r)]] == stock_r
    assert all(p.kind is p.KEYWORD_ONLY for p in ours_r[len(stock_r) :])


def test_every_dcp_argument_at_its_default_is_taken(tmp_path: Path):
    defaults = {
        n: p.default
        for n, p in inspect.signature(dcp.FileSystemWriter.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    sd = state()
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path, **defaults), no_dist=True)
    got = zeros_like(sd)
    dcp.load(got, storage_reader=ht.FileSystemReader(tmp_path, None), no_dist=True)
    assert_same(got, sd)


@pytest.mark.parametrize("writer", ["hostreg", "stock"])
@pytest.mark.parametrize("reader", ["hostreg", "stock"])
def test_stream_transforms_are_written_and_read(tmp_path: Path, writer: str, reader: str):
    """A save with ``_extensions`` (hostreg's writer: DCP's own path) loads through either reader
    given the registry; hostreg's reader, like DCP's, refuses it without one."""
    sd = state(1)
    cls = ht.FileSystemWriter if writer == "hostreg" else dcp.FileSystemWriter
    w = cls(tmp_path, _extensions=[Xor()])
    if writer == "hostreg":
        assert w.stock
    dcp.save(sd, storage_writer=w, no_dist=True)
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("*.distcp"))
    assert sd["w"].numpy().tobytes()[:64] not in raw  # the bytes went through the transform
    got = zeros_like(sd)
    rcls = ht.FileSystemReader if reader == "hostreg" else dcp.FileSystemReader
    dcp.load(got, storage_reader=rcls(tmp_path, registry()), no_dist=True)
    assert_same(got, sd)
    with pytest.raises(BaseException, match="extension|stream.test_xor"):  # DCP wraps a rank's error
        dcp.load(zeros_like(sd), storage_reader=rcls(tmp_path), no_dist=True)
    # hostreg's check of every byte takes transformed items as opaque ranges, not damage
    from hostreg.torch._checkpoint.verify import verify_checkpoint

    assert verify_checkpoint(str(tmp_path)).problems == []
    got = zeros_like(sd)
    dcp.load(got, storage_reader=ht.FileSystemReader(tmp_path, registry(), verify=True), no_dist=True)
    assert_same(got, sd)


def test_a_format_other_than_torch_save_is_dcps_own_writers(tmp_path: Path):
    """SAFETENSORS: hostreg's writer hands the save to DCP's own code: the same files, holding
    the same tensors and header metadata (torch 2.13's own FileSystemReader does not read that
    format back: DCP's Hugging Face readers do)."""
    fmt = getattr(pytest.importorskip("torch.distributed.checkpoint.filesystem"), "SerializationFormat", None)
    if fmt is None:
        pytest.skip("this torch's writer has one format")
    pytest.importorskip("safetensors")
    sd = state(2)
    w = ht.FileSystemWriter(tmp_path / "h", serialization_format=fmt.SAFETENSORS)
    assert w.stock
    dcp.save(sd, storage_writer=w, no_dist=True)
    dcp.save(
        sd, storage_writer=dcp.FileSystemWriter(tmp_path / "s", serialization_format=fmt.SAFETENSORS), no_dist=True
    )
    from safetensors import safe_open

    def files(d: Path) -> dict:
        out = {}
        for p in sorted(d.glob("*.distcp")):
            with safe_open(str(p), framework="pt") as f:  # its JSON header's key order is not fixed
                out[p.name] = (f.metadata(), {k: f.get_tensor(k) for k in f.keys()})
        return out

    ours, theirs = files(tmp_path / "h"), files(tmp_path / "s")
    assert ours.keys() == theirs.keys() and ours
    for name, (meta, tensors) in ours.items():
        assert meta == theirs[name][0]
        assert tensors.keys() == theirs[name][1].keys() == sd.keys()
        for k, t in tensors.items():
            assert torch.equal(t, sd[k]) and torch.equal(t, theirs[name][1][k])


def test_async_save_without_a_stager_stages_with_the_writer_as_with_dcps(tmp_path: Path):
    """hostreg's writer is DCP's AsyncStager too: dcp.async_save takes it as the stager. With
    cache_staged_state_dict=True it stages into a page-locked arena reused by the next save
    (where DCP's own writer's Tensor.pin_memory() raises on a host without an accelerator),
    and close() releases it; without, DCP's fresh copy each save."""
    import hostreg

    for cache in (True, False):
        sd = state(3)
        w = ht.FileSystemWriter(tmp_path, cache_staged_state_dict=cache)
        for i in range(3):
            d = tmp_path / f"{cache}{i}"
            f = dcp.async_save(sd, storage_writer=w, checkpoint_id=d, no_dist=True)
            (f.result() if hasattr(f, "result") else f.upload_completion.result())
            if cache:
                assert w._stager.arenas_created == 1 and hostreg.stats().registrations >= 1
            got = zeros_like(sd)
            dcp.load(got, storage_reader=ht.FileSystemReader(d), no_dist=True)
            assert_same(got, sd)
            sd["w"].add_(1)
        w.close()
        w.close()
    assert hostreg.stats().registrations == 0


def test_an_argument_this_torch_lacks_is_a_clear_error_and_hostregs_own_are_keywords(tmp_path: Path):
    with pytest.raises(TypeError):
        ht.FileSystemReader(tmp_path, None, 4)  # thread_count is keyword-only now
    with pytest.raises(TypeError, match="thread_count is a keyword"):
        ht.FileSystemReader(tmp_path, 8)  # the old position of thread_count: DCP's registry now
    with pytest.raises(TypeError, match="overwrite= is the seventh"):
        ht.FileSystemWriter(tmp_path, True, True, None, False)  # the old position of overwrite
    r = ht.FileSystemReader(tmp_path, thread_count=4, direct_io=False)
    assert (r.thread_count, r.direct_io) == (4, False)
    with pytest.raises(TypeError):
        ht.FileSystemWriter(tmp_path, True, True, None, 0, False, True, None, None, False)  # direct_io: keyword
    with pytest.raises(ValueError, match="thread_count"):
        ht.FileSystemWriter(tmp_path, thread_count=0)


@pytest.mark.parametrize("thread_count", [1, 2])
def test_torchs_own_rot13_example_with_dcps_keywords(tmp_path: Path, thread_count: int):
    """The calls DCP's own tests make, by keyword (torch's Rot13Example and test registry from
    torch.testing._internal): tensors and a bytes item through the transform, both ways."""
    cu = pytest.importorskip("torch.testing._internal.distributed.checkpoint_utils")
    sd = state(4) | {"blob": io.BytesIO(b"SomeBlobForTesting")}
    w = ht.FileSystemWriter(path=tmp_path, thread_count=thread_count, _extensions=[cu.Rot13Example()])
    dcp.save(sd, storage_writer=w, no_dist=True)
    for rcls in (ht.FileSystemReader, dcp.FileSystemReader):
        got = zeros_like(state(4)) | {"blob": io.BytesIO()}
        dcp.load(
            got, storage_reader=rcls(path=tmp_path, _extension_registry=cu.get_test_extension_registry()), no_dist=True
        )
        assert_same(got, state(4))
        assert got["blob"].getvalue() == b"SomeBlobForTesting"


def _sharded_ranks(rank: int, world: int, path: str) -> bool:
    """Two ranks: ShardedTensors saved under one sharding and loaded under another, a tensor
    becoming a ShardedTensor and back, and non-tensor items, all with hostreg's writer and
    reader (DCP's ShardedTensor code plans the reads; hostreg's classes do the I/O)."""
    import torch.distributed as dist
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec, EnumerableShardingSpec, ShardMetadata

    def full(t: Any) -> torch.Tensor:
        out = torch.zeros(t.shape) if rank == 0 else None
        t.gather(out=out)
        return out

    specs = [
        ChunkShardingSpec(dim=0, placements=["rank:0", "rank:1"]),
        ChunkShardingSpec(dim=0, placements=["rank:1", "rank:0", "rank:0"]),
        EnumerableShardingSpec(
            shards=[
                ShardMetadata(shard_offsets=[0], shard_sizes=[5], placement="rank:1"),
                ShardMetadata(shard_offsets=[5], shard_sizes=[19], placement="rank:0"),
            ]
        ),
    ]
    for a in specs:
        for b in specs:
            torch.manual_seed(rank)
            saved = {
                "st": sharded_tensor.rand(a, 24),
                "plain": torch.arange(24.0) * (1 + specs.index(a)),
                "items": [1, "two"],
            }
            dcp.save(saved, storage_writer=ht.FileSystemWriter(path))
            dist.barrier()
            back = {"st": torch.zeros(24), "plain": sharded_tensor.zeros(b, 24), "items": None}
            dcp.load(back, storage_reader=ht.FileSystemReader(path))
            want_st, got_plain = full(saved["st"]), full(back["plain"])
            if rank == 0:
                assert torch.equal(back["st"], want_st), (a, b)
                assert torch.equal(got_plain, saved["plain"]), (a, b)
            assert back["items"] == [1, "two"]
            dist.barrier()
    return True


def test_sharded_tensors_reshard_and_switch_with_tensors_over_two_ranks(tmp_path: Path):
    from ranks import run_ranks

    assert run_ranks(_sharded_ranks, (str(tmp_path),), timeout=240) == {0: True, 1: True}
