"""hostreg.torch.SavePlanner and the writer's reuse of what it made for a structure: a save
that changes one thing after a save of another structure loads exactly what it saved, with
DCP's stock reader, hostreg's reader and dcp_to_torch_save, and writes the .metadata DCP's own
planner would; reuse happens where the structure is the same (and only there); torch's own
plan caching in the same process changes none of it; two ranks over gloo."""

from __future__ import annotations

import dataclasses
import io
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ranks import run_ranks
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

import hostreg.torch as ht
from hostreg.torch._checkpoint import fixed as _fixed
from hostreg.torch._checkpoint import keyed as _keyed
from hostreg.torch._checkpoint import planner as _planner

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(autouse=True)
def _fresh_caches():
    ht.clear_plan_cache()
    yield
    ht.clear_plan_cache()


def rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 100).to(dtype)


def base(seed: int = 0) -> dict:
    return {
        "model": {f"w{i}": rand(40, 30, seed=seed + i) for i in range(6)},
        "big": rand(300_000, seed=seed + 99),  # past 256 KiB: written from its memory with O_DIRECT
        "optim": {"step": torch.tensor(float(seed)), "param_groups": [{"lr": 0.1 + seed, "params": [0, 1]}]},
    }


def like(sd):
    if isinstance(sd, dict):
        return {k: like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [like(v) for v in sd]
    if isinstance(sd, torch.Tensor):
        return torch.full_like(sd, 7) if sd.numel() else torch.empty_like(sd)
    return None


def flat(sd, prefix: str = "") -> dict:
    out = {}
    items = sd.items() if isinstance(sd, dict) else enumerate(sd) if isinstance(sd, list) else None
    if items is None:
        return {prefix: sd}
    for k, v in items:
        out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def assert_loads(path: Path, sd: dict) -> None:
    """Every reader gives back exactly ``sd``."""
    want = flat(sd)
    for reader in ("stock", "hostreg", "hostreg+planner"):
        dest = like(sd)
        kw: dict = {"checkpoint_id": path} if reader == "stock" else {"storage_reader": ht.FileSystemReader(path)}
        if reader == "hostreg+planner":
            kw["planner"] = ht.LoadPlanner()
        dcp.load(dest, **kw)
        got = flat(dest)
        assert got.keys() == want.keys(), reader
        for k, v in want.items():
            if isinstance(v, torch.Tensor):
                assert got[k].dtype == v.dtype and torch.equal(got[k], v), (reader, k)
            else:
                assert got[k] == v, (reader, k)
    torch_file = path.parent / f"{path.name}.pt"
    dcp_to_torch_save(path, torch_file)
    full = torch.load(torch_file, weights_only=False)
    for k, v in flat(full).items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, want[k]), k


def save(sd: dict, path: Path, writer: str = "hostreg") -> None:
    w = ht.FileSystemWriter(path) if writer == "hostreg" else dcp.FileSystemWriter(path)
    dcp.save(sd, storage_writer=w, planner=ht.SavePlanner())


def stock_metadata(sd: dict, path: Path):
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(path), planner=DefaultSavePlanner())
    return dcp.FileSystemReader(path).read_metadata()


def changed(kind: str) -> tuple[dict, dict]:
    a = base(0)
    b = base(1)
    m = b["model"]
    if kind == "shape":
        m["w2"] = rand(30, 40, seed=5)
    elif kind == "dtype-same-size":
        m["w2"] = rand(40, 30, dtype=torch.int32, seed=5)
    elif kind == "dtype-only":
        m["w2"] = rand(40, 30, dtype=torch.float16, seed=5)
    elif kind == "key-added":
        m["w6"] = rand(3, seed=6)
    elif kind == "key-removed":
        del m["w5"]
    elif kind == "key-renamed":
        m["v5"] = m.pop("w5")
    elif kind == "key-type":
        a["model"][1] = rand(4, seed=1)
        b["model"][True] = rand(4, seed=2)
    elif kind == "nesting":
        b = {f"model.{k}": v for k, v in m.items()} | {k: v for k, v in b.items() if k != "model"}
    elif kind == "view":
        m["w3"] = m["w4"]  # one tensor under two keys, then a view of another's storage
        m["w1"] = b["big"][:1200].view(40, 30)
    elif kind == "non-contiguous":
        m["w2"] = rand(30, 40, seed=5).t()
    elif kind == "requires-grad":
        m["w2"] = m["w2"].requires_grad_()
    elif kind == "value":
        b["optim"]["param_groups"][0]["lr"] = 123.0
    elif kind == "same":
        pass
    return a, b


KINDS = [
    "same",
    "shape",
    "dtype-same-size",
    "dtype-only",
    "key-added",
    "key-removed",
    "key-renamed",
    "key-type",
    "nesting",
    "view",
    "non-contiguous",
    "requires-grad",
    "value",
]


@pytest.mark.parametrize("writer", ["hostreg", "stock"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_save_after_another_structure_loads_exactly_what_it_saved(tmp_path: Path, kind: str, writer: str):
    a, b = changed(kind)
    save(a, tmp_path / "a", writer)
    save(a, tmp_path / "a2", writer)  # the structure is now one the planner (and writer) remember
    save(b, tmp_path / "b", writer)
    assert_loads(tmp_path / "a", a)
    assert_loads(tmp_path / "a2", a)
    assert_loads(tmp_path / "b", b)
    want = stock_metadata(b, tmp_path / "stock")
    got = dcp.FileSystemReader(tmp_path / "b").read_metadata()
    assert got.state_dict_metadata == want.state_dict_metadata
    assert got.planner_data == want.planner_data


def test_the_same_structure_is_planned_and_laid_out_once(tmp_path: Path, monkeypatch):
    made = {"local": 0, "global": 0, "layout": 0}
    real_local, real_global, real_layout = (
        DefaultSavePlanner.create_local_plan,
        DefaultSavePlanner.create_global_plan,
        _fixed.lay_out,
    )

    def count(name, fn):
        def wrapped(*a, **k):
            made[name] += 1
            return fn(*a, **k)

        return wrapped

    monkeypatch.setattr(DefaultSavePlanner, "create_local_plan", count("local", real_local))
    monkeypatch.setattr(DefaultSavePlanner, "create_global_plan", count("global", real_global))
    monkeypatch.setattr(_fixed, "lay_out", count("layout", real_layout))
    sd = base(0)
    for i in range(4):
        for t in sd["model"].values():
            t.add_(1)
        save(sd, tmp_path / f"s{i}")
        assert_loads(tmp_path / f"s{i}", sd)
    assert made == {"local": 1, "global": 1, "layout": 1}
    # New tensors of the same structure (as state_dict() makes): still no new plan.
    sd = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in sd.items()}
    sd["model"] = {k: v.clone() for k, v in sd["model"].items()}
    save(sd, tmp_path / "clone")
    assert_loads(tmp_path / "clone", sd)
    assert made["local"] == 1 and made["global"] == 1
    # cache_plans=False plans every save.
    dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path / "off"), planner=ht.SavePlanner(cache_plans=False))
    assert made["local"] == 2
    assert_loads(tmp_path / "off", sd)


def test_a_structure_laid_out_in_parts_as_it_is_written_is_reused_whole(tmp_path: Path, monkeypatch):
    """The first save lays out its fixed part in parts, each written while the next is laid
    out (here a part every 3 tensors); later saves write that part in one call. Each save loads
    back exactly, and the files of saves of the same values are byte for byte the same."""
    from hostreg.torch._checkpoint import parts as _parts

    monkeypatch.setattr(_parts, "PART_ITEMS", 3)
    monkeypatch.setattr(_parts, "PART_BYTES", 1)
    submitted = []
    real_submit = _parts._PartWriter.submit
    monkeypatch.setattr(
        _parts._PartWriter,
        "submit",
        lambda self, part, flags: submitted.append(type(part).__name__) or real_submit(self, part, flags),
    )
    sd = base(0)
    sd["model"].update({f"v{i}": rand(i + 1, 7, dtype=torch.bfloat16, seed=40 + i) for i in range(14)})
    save(sd, tmp_path / "first")
    assert submitted.count("_FileLayout") >= 6 and "FixedPart" not in submitted, submitted
    assert_loads(tmp_path / "first", sd)
    submitted.clear()
    save(sd, tmp_path / "again")
    assert submitted[0] == "FixedPart", submitted
    assert_loads(tmp_path / "again", sd)
    name = "__0_0.distcp"
    assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    for t in sd["model"].values():
        t.mul_(-1)
    save(sd, tmp_path / "third")
    assert_loads(tmp_path / "third", sd)


def test_torch_own_plan_caching_in_the_same_process_changes_nothing(tmp_path: Path):
    """torch's DefaultSavePlanner(enable_plan_caching=True) keeps one plan per class name; the
    three cases where it reuses a plan that no longer fits (a dtype-only change, a change of
    nesting) are saved with it in between, and hostreg's planner saves them right."""
    if "enable_plan_caching" not in _planner._DEFAULT_ARGS:
        pytest.skip("this torch has no enable_plan_caching")
    cases = [changed("dtype-only"), changed("nesting")]
    for n, (a, b) in enumerate(cases):
        for i, sd in enumerate((a, b, a, b)):
            torch_path, ours = tmp_path / f"t{n}{i}", tmp_path / f"h{n}{i}"
            dcp.save(
                sd,
                storage_writer=dcp.FileSystemWriter(torch_path),
                planner=DefaultSavePlanner(enable_plan_caching=True),
            )
            save(sd, ours)
            assert_loads(ours, sd)
            md = dcp.FileSystemReader(ours).read_metadata()
            assert md.planner_data == stock_metadata(sd, tmp_path / f"s{n}{i}").planner_data


def test_a_tensor_moved_within_its_block_is_laid_out_again(tmp_path: Path):
    """Any address is written right (a segment's memory is its own); one that moved within its
    block gets a layout of its own, so that its bytes still go to the disk straight from it."""
    sd = {"a": torch.arange(100_000, dtype=torch.float32), "b": torch.arange(70_000, dtype=torch.int64)}
    save(sd, tmp_path / "one")
    save(sd, tmp_path / "two")
    raw = torch.empty(100_000 * 4 + 64, dtype=torch.uint8)
    moved = raw[4:].view(torch.float32)[:100_000]  # the same values 4 bytes further on
    moved.copy_(sd["a"])
    sd2 = {"a": moved, "b": sd["b"]}
    w = ht.FileSystemWriter(tmp_path / "three")
    dcp.save(sd2, storage_writer=w, planner=ht.SavePlanner())
    assert_loads(tmp_path / "three", sd2)
    assert w.stats.bounced_bytes < 100_000 or not w.stats.direct  # "a" (400 KB) went from its memory


def test_metadata_from_a_prefix_is_what_pickle_gives(tmp_path: Path):
    """The .metadata a reused plan writes (a remembered prefix and this save's suffix, with a
    bytes item laid out at each save) unpickles to the very Metadata the writer was given,
    equal to what pickle.dumps of that object gives."""
    sd = base(0) | {"blob": io.BytesIO(b"bytes item"), "n": 5}
    for i in range(3):
        sd["n"] = i
        got = dcp.save(sd, storage_writer=ht.FileSystemWriter(tmp_path / f"m{i}"), planner=ht.SavePlanner())
        raw = (tmp_path / f"m{i}" / ".metadata").read_bytes()
        assert pickle.loads(raw) == got == pickle.loads(pickle.dumps(got))
        assert len(got.storage_data) == len(got.state_dict_metadata)  # every item where it lies, the bytes ones too
        assert got.storage_meta.checkpoint_id == str(tmp_path / f"m{i}")
        dest = like(sd) | {"blob": io.BytesIO(), "n": None}
        dcp.load(dest, checkpoint_id=tmp_path / f"m{i}")
        assert dest["n"] == i and dest["blob"].getvalue() == b"bytes item"


def _ranks_alone_then_together(rank: int, world: int, root: str) -> dict:
    import torch.distributed as dist

    sds = []
    for step in range(4):
        # rank-own keys (a plain tensor under one key on two ranks is one replicated tensor to DCP)
        sd = {f"own{rank}": rand(50, seed=100 * rank + step), "shared": rand(8, seed=step)}
        if step == 3 and rank == 1:
            sd["extra"] = rand(3, seed=7)  # one rank's structure changes
        sds.append(sd)
        # each rank alone, then both together, with the same planners' caches
        dcp.save(
            sd,
            storage_writer=ht.FileSystemWriter(f"{root}/alone{rank}_{step}"),
            planner=ht.SavePlanner(),
            use_collectives=False,
        )
        dist.barrier()
        dcp.save(sd, storage_writer=ht.FileSystemWriter(f"{root}/both{step}"), planner=ht.SavePlanner())
    out = []
    for step, sd in enumerate(sds):
        for where in (f"{root}/alone{rank}_{step}", f"{root}/both{step}"):
            dest = {k: torch.zeros_like(v) for k, v in sd.items()}
            dcp.load(dest, checkpoint_id=where)
            out.append(all(torch.equal(dest[k], sd[k]) for k in sd))
    return {"ok": out, "received": len(_keyed._received)}


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_alone_then_together_then_one_changes(tmp_path: Path, world: int):
    got = run_ranks(_ranks_alone_then_together, (str(tmp_path),), world=world)
    for rank, res in got.items():
        assert all(res["ok"]), (rank, res)
    assert got[0]["received"] > 0  # the coordinator rebuilt rank 1's plans from tokens


def test_load_planner_makes_the_read_items_dcps_makes(tmp_path: Path):
    """hostreg's LoadPlanner against DCP's DefaultLoadPlanner on one checkpoint: equal plans
    for whole tensors, 0-d and empty ones, bytes, a partial load and a resized destination."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    sd = base(0) | {"empty": torch.empty(0, 3), "scalar": torch.tensor(2.5), "blob": io.BytesIO(b"x")}
    save(sd, tmp_path / "c")
    md = dcp.FileSystemReader(tmp_path / "c").read_metadata()

    def plans(dest: dict, **kw) -> tuple:
        out = []
        for cls in (DefaultLoadPlanner, ht.LoadPlanner):
            p = cls(**kw)
            p.set_up_planner(dest, md, True)
            out.append(p.create_local_plan().items)
        return tuple(out)

    dest = like(sd) | {"blob": io.BytesIO()}
    want, got = plans(dest)
    assert got == want and len(got) > 10
    partial = {"big": torch.zeros(300_000), "missing": torch.zeros(2)}
    want, got = plans(partial, allow_partial_load=True)
    assert got == want
    with pytest.raises(RuntimeError, match="Missing key"):
        plans(partial)
    with pytest.raises(ValueError, match="Size mismatch"):
        plans({"big": torch.zeros(5)})
    dcp.load(dest, storage_reader=ht.FileSystemReader(tmp_path / "c"), planner=ht.LoadPlanner())
    for k, v in flat(sd).items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(flat(dest)[k], v), k


def test_the_first_local_plan_is_dcps(monkeypatch):
    """hostreg's SavePlanner's first plan of a structure of dicts, plain tensors and scalars
    (flattened by its own walk) against DCP's: the same flattened state dict, mappings, items
    and planner data; a list among the values is flattened by DCP's code."""
    plain = {k: v for k, v in base(0).items() if k != "optim"} | {
        "nested": {"a.b": torch.randn(2, 3).to(torch.bfloat16), "c": {"d": torch.tensor(1.5).requires_grad_()}},
        "empty": torch.empty(0, 3),
        "sparse": torch.randn(3, 3).to_sparse(),
        "lr": 0.1,
        "name": "x",
        "none": None,
        "raw": b"x",
    }
    walked = []
    real = _planner._flat

    def spy(state_dict):
        got = real(state_dict)
        walked.append(got is not None)
        return got

    monkeypatch.setattr(_planner, "_flat", spy)
    for sd, ours in ((plain, True), (base(0), False)):
        got = []
        for cls in (DefaultSavePlanner, ht.SavePlanner):
            p = cls()
            p.set_up_planner(sd, None, True)
            plan = p.create_local_plan()
            got.append(
                (list(p.state_dict.items()), p.mappings, plan.items, plan.planner_data, pickle.dumps(plan.items))
            )
        assert got[0] == got[1] and len(got[0][2]) > 7
        assert type(got[1][1]) is dict and walked == [ours]
        walked.clear()


def _global_plans(planner: DefaultSavePlanner, local: list) -> tuple[list, Any]:
    plans, md = planner._create_global_plan(local)
    return [[vars(i) | {"index": vars(i.index)} for i in p.items] for p in plans], md


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_global_plan_is_dcps(ranks: int, monkeypatch):
    """hostreg's SavePlanner's first global plan (global_plan.py) against DCP's: the same items
    (every field, the rewritten chunk index), Metadata and planner data, for one rank's plan
    (no dedup) and two ranks' (replicated tensors deduplicated by DCP's code); a plan whose
    chunk lies outside its tensor fails DCP's validation as it does with DCP's planner."""
    sd = base(0) | {"empty": torch.empty(0, 3), "scalar": torch.tensor(2.5), "blob": io.BytesIO(b"x")}
    local = []
    for rank in range(ranks):
        p = DefaultSavePlanner()
        p.set_up_planner(sd, None, rank == 0)
        local.append(p.create_local_plan())
    want_items, want_md = _global_plans(DefaultSavePlanner(), local)
    got_items, got_md = _global_plans(ht.SavePlanner(), local)
    assert got_items == want_items and sum(map(len, got_items)) > 10
    assert (
        got_md == want_md
        and got_md.planner_data == want_md.planner_data
        and pickle.dumps(got_md) == pickle.dumps(want_md)
    )
    if ranks == 2:
        assert len(got_items[0]) != len(got_items[1])  # DCP's dedup ran: the ranks split the items
        # A torch whose planner has no _dedup_save_plans method: DCP's module function instead.
        monkeypatch.delattr(DefaultSavePlanner, "_dedup_save_plans")
        assert _global_plans(ht.SavePlanner(), local) == (want_items, want_md)
        monkeypatch.undo()
    item = local[0].items[0]
    chunk = dataclasses.replace(item.tensor_data.chunk, offsets=torch.Size([5] * len(item.tensor_data.size)))
    bad = dataclasses.replace(item, tensor_data=dataclasses.replace(item.tensor_data, chunk=chunk))
    broken = [dataclasses.replace(local[0], items=[bad, *local[0].items[1:]]), *local[1:]]
    for planner in (DefaultSavePlanner(), ht.SavePlanner()):
        with pytest.raises(ValueError, match="Failed to validate global plan: key:.*out of bounds chunk"):
            planner._create_global_plan(broken)


@pytest.mark.parametrize("kind", KINDS)
def test_staged_state_dicts_after_another_structure_load_what_was_staged(tmp_path: Path, kind: str):
    """Through a Stager, whose staged tensors the planner knows by their slot (_issued.py)."""
    a, b = changed(kind)
    with ht.Stager() as stager:
        for name, sd in (("a", a), ("a2", a), ("b", b), ("b2", b)):
            staged = stager.stage(sd)
            dcp.save(staged, storage_writer=ht.FileSystemWriter(tmp_path / name), planner=ht.SavePlanner())
            del staged
            assert_loads(tmp_path / name, sd)


def _fsdp_ranks(rank: int, world: int, path: str) -> None:
    from ranks import app_state, build, differences, full_values, train_step
    from torch.distributed.checkpoint import state_dict_saver
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    wants = []
    stager = ht.Stager(async_staging=True)
    for step, (kind, checkpointer) in enumerate(
        (("fsdp", "THREAD"), ("fsdp", "PROCESS"), ("fsdp", "THREAD"), ("tp", "THREAD"))
    ):
        model, opt = build(kind, seed=step, mesh=mesh)  # the last: another sharding, the same planner caches
        train_step(model, opt, step)
        sd = app_state(model, opt)
        wants.append(full_values(sd))
        res = dcp.async_save(
            sd,
            storage_writer=ht.FileSystemWriter(f"{path}/s{step}"),
            async_stager=stager,
            planner=ht.SavePlanner(),
            async_checkpointer_type=getattr(state_dict_saver.AsyncCheckpointerType, checkpointer),
        )
        res.upload_completion.result(timeout=120)
    stager.close()
    for step, want in enumerate(wants):
        for reader in (ht.FileSystemReader(f"{path}/s{step}"), dcp.FileSystemReader(f"{path}/s{step}")):
            model2, opt2 = build("tp" if step % 2 == 0 else "fsdp", seed=99, mesh=mesh)  # resharded on load
            train_step(model2, opt2, 0)
            sd2 = app_state(model2, opt2)
            dcp.load(sd2, storage_reader=reader, planner=ht.LoadPlanner())
            set_state_dict(model2, opt2, model_state_dict=sd2["model"], optim_state_dict=sd2["optim"])
            bad = differences(full_values(app_state(model2, opt2)), want)
            assert not bad, f"save {step}, {type(reader).__module__}: " + "; ".join(bad[:5])


def test_fsdp2_saves_with_the_planner_and_reshard_on_load_over_ranks_alone_then_together(tmp_path: Path):
    run_ranks(_fsdp_ranks, (str(tmp_path),), world=2, timeout=300)


def test_containers_under_keys_that_are_not_str_are_saved_at_every_save(tmp_path: Path):
    """DCP keeps a list of plain values or a tuple as one item under the str of its key; a
    reused plan must still find it under the real key (0, not "0")."""
    for i in range(3):
        sd = {"w": torch.ones(3), "state": {0: {"exp_avg": torch.zeros(2), "betas": (0.9, 0.999 + i)}}, 7: [1, 2, i]}
        save(sd, tmp_path / f"c{i}")
        dest = {"w": torch.empty(3), "state": {0: {"exp_avg": torch.empty(2), "betas": None}}, "7": None}
        dcp.load(dest, checkpoint_id=tmp_path / f"c{i}")
        assert dest["state"]["0"]["betas"] == (0.9, 0.999 + i) and dest["7"] == [1, 2, i]  # DCP's own str keys


def test_requires_grad_set_on_a_staged_tensor_reaches_the_metadata(tmp_path: Path):
    with ht.Stager() as stager:
        staged = stager.stage({"a": torch.randn(3)})
        save(staged, tmp_path / "first")
        staged["a"].requires_grad_(True)
        save(staged, tmp_path / "second")
        del staged
    md = dcp.FileSystemReader(tmp_path / "second").read_metadata()
    assert md.state_dict_metadata["a"].properties.requires_grad


@pytest.mark.parametrize("big", [0, 70_000, 200_000])
def test_a_prefix_cut_from_frames_or_not_unpickles_whole(big: int):
    """The prefix's last frame is shortened by the bytes cut; a pickle with a bytes object
    written outside any frame (64 KiB or more) is pickled again without frames."""
    from hostreg.torch._checkpoint.metadata_file import _cut_frames

    obj = {"a": list(range(20_000)), "b": b"x" * big, "c": "end"}
    raw = pickle.dumps(obj, protocol=4)
    assert pickle.loads(_cut_frames(raw, 1) + b".") == obj  # cut the STOP, put it back
