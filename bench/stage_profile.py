"""Where staging's time goes, by phase, per tensor: a profile of hostreg's first stage
(``create_cpu_state_dict`` + ``copy_state_dict``) and of a ``Stager`` restage.

Run (after scripts/setup):  .venv/bin/python bench/stage_profile.py [--tensors 5000 50000] [--bytes 1024]

Each phase is the same step hostreg takes, timed alone on the same state dict (``--tensors``
tensors of ``--bytes`` bytes each, fp32), minimum of ``--repeats`` runs, with Python's cyclic
collector paused as staging pauses it; "total" is the whole call, timed as users call it. The
phases' sum may differ from the total by the cost of what ties them together. Not a test: it
prints tables (microseconds a tensor) to read beside bench/stage_bench.py's.
"""

from __future__ import annotations

import argparse
import copy
import gc
import time
import weakref
from typing import Any, Callable

import torch
from rich.console import Console
from rich.table import Table

import hostreg.torch as ht
from hostreg.torch import _arena, _copy, _layout, _sources, _tree


def best(fn: Callable[[], Any], repeats: int) -> float:
    """Minimum seconds of fn() over repeats runs (what it returns is dropped after timing)."""
    out = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            t = time.perf_counter()
            r = fn()
            out = min(out, time.perf_counter() - t)
        finally:
            gc.enable()
        del r
    return out


def first_stage(sd: dict, repeats: int) -> dict[str, float]:
    """create_cpu_state_dict + copy_state_dict, and each step of it."""
    phases: dict[str, float] = {}
    layout, tensors, values = _layout.layout_of(sd)
    phases["flatten + type check"] = best(lambda: _layout.flatten_checked(sd), repeats)
    flat = _layout.flatten_checked(sd)
    phases["layout (grouping, leaf records)"] = best(lambda: _layout.layout_of(sd, flat), repeats)
    phases["arena (memory made, populated, registered)"] = best(lambda: _arena.Arena(layout.nbytes), repeats)
    arena = _arena.Arena(layout.nbytes)
    phases["span storages and staged tensors"] = best(lambda: arena.staged_leaves(layout), repeats)
    _, leaves = arena.staged_leaves(layout)
    phases["staged dict (unflatten)"] = best(
        lambda: _tree.unflatten(layout.spec, leaves, copy.deepcopy(values)), repeats
    )
    phases["sources' key (for the plan)"] = best(lambda: _sources.source_key(tensors), repeats)
    made_for = (_sources.source_key(tensors), layout.grouping)
    dgroup = layout.grouping.as_destination()
    phases["copy plan (destinations measured)"] = best(
        lambda: _copy.CopyPlan(leaves, weak=True, made_for=made_for, grouping=dgroup), repeats
    )
    phases["keys again (sources', destinations')"] = best(
        lambda: (_sources.source_key(tensors), _sources.source_key(leaves)), repeats
    )

    def first_copy() -> None:
        plan = _copy.CopyPlan(leaves, weak=True, made_for=made_for, grouping=dgroup)
        skey = _sources.source_key(tensors)
        plan.copy(tensors, key=(skey, _sources.source_key(leaves)), src_key=skey)

    phases["first copy (check, memcpy batch)"] = (
        best(first_copy, repeats)
        - phases["keys again (sources', destinations')"]
        - phases["copy plan (destinations measured)"]
    )

    def whole() -> Any:
        staged = ht.create_cpu_state_dict(sd)
        ht.copy_state_dict(sd, staged)
        return staged

    phases["total"] = best(whole, repeats)
    arena.close()
    return phases


def restage(sd: dict, repeats: int) -> dict[str, float]:
    """A Stager's restage of unchanged sources, and each step of it."""
    phases: dict[str, float] = {}
    with ht.Stager() as stager:
        stager.stage(sd)
        stager.stage(sd)
        slot = stager._pool.slots[0]
        flat = _layout.flatten_checked(sd)
        key = _sources.source_key(flat[0])
        phases["flatten + type check"] = best(lambda: _layout.flatten_checked(sd), repeats)
        phases["source key"] = best(lambda: _sources.source_key(flat[0]), repeats)
        phases["layout reused (spec and key compared)"] = best(lambda: stager._layout_for(sd, flat, key), repeats)
        phases["slot: moved? busy?"] = best(lambda: (slot.moved(), slot.busy()), repeats)
        rp = slot.plan._replay
        assert rp is not None, "the restage did not replay"
        phases["memcpy batch (replayed)"] = best(lambda: _copy._hostreg.copy_batch(rp[1], rp[2], rp[3], 0), repeats)
        leaves = slot.staged.tensors
        phases["tensors handed out (detach)"] = best(lambda: list(map(torch.Tensor.detach, leaves)), repeats)
        fresh = list(map(torch.Tensor.detach, leaves))
        phases["weak references to them"] = best(lambda: list(map(weakref.ref, fresh)), repeats)
        phases["staged dict (unflatten)"] = best(
            lambda: _tree.unflatten(slot.staged.layout.spec, fresh, copy.deepcopy(flat[1])), repeats
        )
        phases["total"] = best(lambda: stager.stage(sd), repeats)
    return phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, nargs="+", default=[5000, 50000])
    parser.add_argument("--bytes", type=int, default=1024, help="bytes a tensor (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    out = Console()
    for name, fn in (
        ("first stage (create_cpu_state_dict + copy_state_dict)", first_stage),
        ("Stager restage", restage),
    ):
        results = {}
        for n in opts.tensors:
            sd = {"model": {f"p{i}": torch.randn(opts.bytes // 4) for i in range(n)}}
            results[n] = fn(sd, opts.repeats)
        table = Table(title=f"{name}: us a tensor ({opts.bytes:,}-byte tensors, min of {opts.repeats})")
        table.add_column("phase")
        for n in opts.tensors:
            table.add_column(f"{n:,} tensors", justify="right")
        for phase in results[opts.tensors[0]]:
            table.add_row(phase, *(f"{results[n][phase] / n * 1e6:.2f}" for n in opts.tensors))
        out.print(table)


if __name__ == "__main__":
    main()
