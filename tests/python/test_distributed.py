"""hostreg.torch.Stager with real distributed state dicts: two ranks over gloo on CPU, a
model with tied weights sharded by FSDP2 (``fully_shard``) or tensor parallelism, plus its
AdamW state, from ``get_state_dict``. Each rank saves with ``dcp.async_save`` through the
stager in sync and async modes, with the thread and the background-process checkpointers,
several times, training between saves; then

- every checkpoint loads back exactly, into two ranks (``set_state_dict``) and into one
  process (resharded to full tensors, ``no_dist``);
- DCP's writer cloned nothing and every tensor it wrote lay in the arena, also in the
  background process (no copy on the way there): counted by ``ranks.CountingWriter``;
- VmLck, registrations and /dev/shm descriptors stay constant across saves, and are back to
  where they were after ``close()``;
- the staged dict keeps DTensors (mesh, placements, global shape and strides) and the tied
  weight staged once."""

from __future__ import annotations

import gc
import json
import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from ranks import CountingWriter, app_state, build, differences, full_values, run_ranks, train_step
from torch.distributed.checkpoint import state_dict_saver

import hostreg
import hostreg.torch as ht

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.skipif(
        not hasattr(state_dict_saver, "AsyncSaveResponse"), reason="this torch's async_save takes no Future"
    ),
]

MODES = [(False, "thread"), (False, "process"), (True, "thread"), (True, "process")]
SAVES = 2  # per mode


def shm_fds() -> tuple[int, int]:
    """/dev/shm descriptors open here: (hostreg's, torch's). torch's own reducer moves the
    DeviceMesh's small mesh tensor, pickled with every DTensor, into a /dev/shm file of its own
    at the first save through the background process, once per process."""
    ours = torch_s = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            if target.startswith("/dev/shm/torch_"):
                torch_s += 1
            else:
                ours += 1
    return ours, torch_s


def resources() -> tuple[int, int, int]:
    """(VmLck bytes, hostreg registrations, hostreg's /dev/shm descriptors)."""
    gc.collect()
    return hostreg.locked_bytes(), hostreg.stats().registrations, shm_fds()[0]


def check_staged(sd: dict, staged: dict) -> None:
    """The staged copy keeps every DTensor's mesh, placements, global shape and strides, over
    a local shard in the arena, and stages the tied weight once."""
    from torch.distributed.tensor import DTensor

    from hostreg.torch import _sharing

    dtensors = 0
    for key, src in sd["model"].items():
        dst = staged["model"][key]
        assert type(dst) is type(src), key
        if isinstance(src, DTensor):
            dtensors += 1
            assert (dst.device_mesh, dst.placements, dst.shape, dst.stride()) == (
                src.device_mesh,
                src.placements,
                src.shape,
                src.stride(),
            ), key
            local = dst.to_local()
            assert torch.equal(local, src.to_local()), key
        else:
            local = dst
        assert _sharing.staging_buffer_of(local) is not None, f"{key} is not in the arena"
        assert local.untyped_storage().nbytes() == local.nbytes, f"{key}: its storage holds more than its bytes"
    assert dtensors >= 4
    emb, head = staged["model"]["emb.weight"], staged["model"]["head.weight"]
    emb = emb.to_local() if isinstance(emb, DTensor) else emb
    head = head.to_local() if isinstance(head, DTensor) else head
    assert emb.untyped_storage().data_ptr() == head.untyped_storage().data_ptr(), "the tied weight was staged twice"


def _saves(rank: int, world: int, kind: str, path: str) -> dict:
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import set_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    ckpt_pg = dist.new_group(backend="gloo")  # saves' collectives apart from training's
    model, opt = build(kind, seed=0, mesh=mesh)
    step = 0
    train_step(model, opt, step)
    wants: dict[str, dict] = {}
    baseline = resources()
    report: dict = {"pid": os.getpid(), "tags": []}
    for async_staging in (False, True):
        stager = ht.Stager(async_staging=async_staging)
        seen: set[tuple] = set()
        for _, kind_name in [m for m in MODES if m[0] == async_staging]:
            checkpointer = getattr(state_dict_saver.AsyncCheckpointerType, kind_name.upper())
            for i in range(SAVES):
                step += 1
                train_step(model, opt, step)
                sd = app_state(model, opt)
                if not async_staging and kind_name == "thread" and i == 0:
                    staged = stager.stage(sd)
                    check_staged(sd, staged)
                    del staged
                wants[tag := f"{'async' if async_staging else 'sync'}-{kind_name}-{i}"] = full_values(sd)
                res = dcp.async_save(
                    sd,
                    storage_writer=CountingWriter(f"{path}/{tag}", f"{path}/{tag}.rank{rank}.json"),
                    async_stager=stager,
                    async_checkpointer_type=checkpointer,
                    process_group=ckpt_pg,
                )
                if async_staging:
                    assert isinstance(res, state_dict_saver.AsyncSaveResponse), type(res)
                    res.staging_completion.result(timeout=120)
                    step += 1
                    train_step(model, opt, step)  # the source may change now; the checkpoint must not
                    res.upload_completion.result(timeout=120)
                else:
                    step += 1
                    train_step(model, opt, step)
                    res.result(timeout=120)
                del res, sd
                now = resources()
                seen.add(now)
                report.setdefault("resources", []).append((tag, now, shm_fds()[1]))
                report["tags"].append(tag)
        assert len(seen) == 1, f"VmLck, registrations, /dev/shm fds changed across saves: {report['resources']}"
        assert next(iter(seen))[1:] == (1, 1) and stager.arenas_created == 1, (seen, stager.arenas_created)
        stager.close()
        # The buffer goes with the last tensor over it; DCP's upload thread may drop its last
        # references to the staged state dict a moment after upload_completion is set.
        deadline = time.monotonic() + 10
        while (now := resources()) != baseline and time.monotonic() < deadline:
            time.sleep(0.05)
        assert now == baseline, f"after close(): {now} != {baseline}"

    # Load every checkpoint back into two ranks (a model and optimizer made afresh).
    for tag, want in wants.items():
        model2, opt2 = build(kind, seed=1, mesh=mesh)
        train_step(model2, opt2, 0)  # AdamW makes its state at the first step
        sd2 = app_state(model2, opt2)
        dcp.load(sd2, checkpoint_id=f"{path}/{tag}")
        set_state_dict(model2, opt2, model_state_dict=sd2["model"], optim_state_dict=sd2["optim"])
        bad = differences(full_values(app_state(model2, opt2)), want)
        assert not bad, f"{tag}, loaded into {world} ranks: " + "; ".join(bad[:5])
    if rank == 0:
        torch.save(wants, f"{path}/wants.pt")
    return report


def load_one_process(kind: str, path: Path, tag: str, want: dict) -> None:
    model, opt = build("plain", seed=2)
    train_step(model, opt, 0)
    sd = app_state(model, opt)
    dcp.load(sd, checkpoint_id=str(path / tag), no_dist=True)
    bad = differences(full_values(sd), want)
    assert not bad, f"{kind} {tag}, loaded into one process: " + "; ".join(bad[:5])


@pytest.mark.parametrize("kind", ["fsdp", "tp"])
def test_two_ranks_sharded_model_and_adamw(kind: str, tmp_path: Path):
    reports = run_ranks(_saves, (kind, str(tmp_path)), world=2, timeout=420)
    wants = torch.load(tmp_path / "wants.pt", weights_only=False)
    assert len(wants) == len(MODES) * SAVES
    for tag, want in wants.items():
        load_one_process(kind, tmp_path, tag, want)
    # What DCP's writer copied: nothing, in the rank or in the background process.
    for rank, rep in reports.items():
        for tag in rep["tags"]:
            counts = json.loads((tmp_path / f"{tag}.rank{rank}.json").read_text())
            assert counts["tensors"] > 10 and counts["bytes"] > 0, counts
            assert (counts["clones"], counts["bytes_cloned"]) == (0, 0), (
                f"{tag} rank {rank}: the writer cloned {counts}"
            )
            assert counts["in_arena"] == counts["tensors"] and counts["bytes_in_arena"] == counts["bytes"], (
                f"{tag} rank {rank}: tensors outside the arena reached the writer (copied): {counts}"
            )
            in_background = counts["pid"] != rep["pid"]
            assert in_background == tag.split("-")[1].startswith("process"), (tag, counts["pid"], rep["pid"])
