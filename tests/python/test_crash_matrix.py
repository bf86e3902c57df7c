"""A save killed at any step that changes the disk leaves a directory that loads exactly the
old checkpoint, exactly the new one, or raises: never a mix. Checkpoint A is saved with or
without collectives (``use_collectives``; without, each rank writes ``__{rank}.metadata``,
which dcp.load falls back to when ``.metadata`` is missing), then B over it with or without,
by 1 and 2 ranks over gloo, and the save of B is killed (SIGKILL of every rank) after each of
its steps in turn: every write of the C core (each part of a file), every metadata removal,
the metadata's rename (crash_cases.py). After each, every rank's state dict is loaded as that
rank's dcp.load would, with hostreg's reader and DCP's stock reader."""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
from collections import Counter
from pathlib import Path

import crash_cases
import pytest
from ranks import free_port

A, B = 1, 2


@pytest.fixture(scope="module")
def ctx():
    c = mp.get_context("forkserver")
    c.set_forkserver_preload(["torch", "torch.distributed.checkpoint", "hostreg.torch", "crash_cases"])
    return c


def save(ctx, path: Path, world: int, save_no: int, collectives: bool, kill=(-1, 0)) -> list[int | None]:
    """Runs a save of ``world`` ranks; each rank's step count (None for a killed rank)."""
    port = free_port()
    outs = [path.parent / f"{path.name}.steps{r}" for r in range(world)]
    for o in outs:
        o.unlink(missing_ok=True)
    pipes, procs = [], []
    for r in range(world):
        parent, child = ctx.Pipe()
        args = (r, world, port, str(path), save_no, collectives, kill, child, str(outs[r]))
        procs.append(ctx.Process(target=crash_cases.save_rank, args=args))
        pipes.append(parent)
        procs[-1].start()
    for p in pipes:
        p.send([q.pid for q in procs])
    for q in procs:
        q.join(120)
        if q.is_alive():
            q.kill()
            pytest.fail(f"a rank of the save into {path} hung")
    return [json.loads(o.read_text()) if o.exists() else None for o in outs]


def load(ctx, path: Path, world: int) -> dict:
    out = path.parent / f"{path.name}.loads"
    p = ctx.Process(target=crash_cases.load_ranks, args=(str(path), world, (A, B), str(out)))
    p.start()
    p.join(120)
    assert p.exitcode == 0, f"the loads of {path} ended with {p.exitcode}"
    return json.loads(out.read_text())


@pytest.mark.parametrize("world", [1, 2])
def test_a_save_killed_after_any_step_loads_as_old_or_new_or_not_at_all(tmp_path: Path, ctx, world: int):
    seen: Counter = Counter()
    for old in (True, False):
        template = tmp_path / f"A-{old}"
        assert None not in save(ctx, template, world, A, old)
        assert all(o == [A, "global" if old else "rank"] for r in load(ctx, template, world).values() for o in r)
        for new in (True, False):
            dry = tmp_path / f"B-{old}-{new}"
            shutil.copytree(template, dry)
            steps = save(ctx, dry, world, B, new)
            assert None not in steps
            got = load(ctx, dry, world)
            assert all(o[0] == B for r in got.values() for o in r), (
                old,
                new,
                got,
                sorted(p.name for p in dry.iterdir()),
            )
            for rank in range(world):
                for k in range(1, steps[rank] + 1):
                    case = tmp_path / f"kill-{old}-{new}-{rank}-{k}"
                    shutil.copytree(template, case)
                    save(ctx, case, world, B, new, kill=(rank, k))
                    for reader, per_rank in load(ctx, case, world).items():
                        where = f"A {'with' if old else 'without'} collectives, B {'with' if new else 'without'}, killed after step {k} of rank {rank}, {reader} reader"
                        outcomes = [o for o, _ in per_rank]
                        assert set(outcomes) <= {A, B, "raised"}, f"{where}: {per_rank}"
                        loaded = {o for o, via in per_rank if via == "global" and o != "raised"}
                        assert len(loaded) <= 1, f"{where}: ranks loaded different saves from one .metadata: {per_rank}"
                        seen.update(map(str, outcomes))
                    shutil.rmtree(case)
    # Not vacuous: kills early leave A or nothing, kills after the last step leave B.
    assert seen["raised"] and seen[str(B)], seen
