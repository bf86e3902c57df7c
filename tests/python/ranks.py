"""Helpers for tests that run several ranks over gloo on CPU: spawning them and collecting
their results (:func:`run_ranks`), a small model with tied weights sharded by FSDP2 or tensor
parallelism, AdamW state, full values of DTensor state dicts, and a ``FileSystemWriter`` that
counts what DCP's writer copies, in whichever process writes (:class:`CountingWriter`).

Rank functions must live in an importable module (ranks are started with ``spawn``)."""

from __future__ import annotations

import gc
import json
import os
import socket
import threading
import time
import traceback
import warnings
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemWriter
from torch.utils._pytree import tree_flatten, tree_map


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(target: Callable, rank: int, world: int, port: int, args: tuple, q: Any) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
        warnings.filterwarnings("ignore")
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
        )
        # What the imports made (torch, DCP: ~400,000 objects) lives as long as the rank: out of
        # the collector's sight, each gc.collect() of the checks below walks only what the rank
        # made (0.3 s a collection otherwise, most of a rank's CPU time). Collected as before.
        gc.freeze()
        result = target(rank, world, *args)
        dist.barrier()
        dist.destroy_process_group()
        q.put((rank, None, result))
    except BaseException:
        q.put((rank, traceback.format_exc(), None))


def run_ranks(target: Callable, args: tuple = (), world: int = 2, timeout: float = 300) -> dict[int, Any]:
    """Run ``target(rank, world, *args)`` in ``world`` spawned processes joined by a gloo
    process group; returns {rank: what target returned}. AssertionError with every failing
    rank's traceback, or when a rank died or did not finish within ``timeout`` seconds."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(target, r, world, port, args, q)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, tuple] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, err, value = q.get(timeout=min(left, 5))
                results[rank] = (err, value)
            except Exception:  # queue.Empty: are the ranks still alive?
                if any(p.exitcode not in (None, 0) for p in procs) and q.empty():
                    time.sleep(1)
                    if q.empty():
                        break
        for p in procs:
            p.join(timeout=max(1, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        q.close()
    errors = {r: e for r, (e, _) in results.items() if e}
    assert not errors, "\n".join(f"rank {r}:\n{e}" for r, e in errors.items())
    assert len(results) == world, f"ranks reported {sorted(results)}; exit codes {[p.exitcode for p in procs]}"
    assert [p.exitcode for p in procs] == [0] * world
    return {r: v for r, (_, v) in results.items()}


# ---- the model ------------------------------------------------------------------------------


class TiedModel(torch.nn.Module):
    """Embedding and output head tied (one weight), two linear layers, a bf16 buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, 16)
        self.l1 = torch.nn.Linear(16, 32)
        self.l2 = torch.nn.Linear(32, 16)
        self.head = torch.nn.Linear(16, 64, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.randn(7).to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.l2(torch.relu(self.l1(self.emb(x)))))


def build(kind: str, seed: int, mesh: Any = None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model (same initial values on every rank for a seed), parallelised by ``kind``:
    "fsdp" (``fully_shard`` per layer and the root), "tp" (column- then row-wise linear
    layers), "plain" (one process). With AdamW over its parameters."""
    torch.manual_seed(seed)
    model = TiedModel()
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.l1, mesh=mesh)
        fully_shard(model.l2, mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif kind == "tp":
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        parallelize_module(model, mesh, {"l1": ColwiseParallel(), "l2": RowwiseParallel()})
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """One step on a batch that is the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, 64, (4, 8), generator=g)
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()


def app_state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def full_values(sd: Any) -> Any:
    """``sd`` with every DTensor replaced by its full value (a collective: every rank calls it
    in the same order) and every tensor copied."""
    from torch.distributed.tensor import DTensor

    def one(v: Any) -> Any:
        if isinstance(v, DTensor):
            return v.full_tensor().detach().clone()
        return v.detach().clone() if isinstance(v, torch.Tensor) else v

    return tree_map(one, sd)


def differences(got: Any, want: Any) -> list[str]:
    """Where two state dicts of full values differ (structure, dtype, shape or a value)."""
    g_leaves, g_spec = tree_flatten(got)
    w_leaves, w_spec = tree_flatten(want)
    if g_spec != w_spec:
        return [f"structure differs:\n{g_spec}\nvs\n{w_spec}"]
    bad = []
    for i, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor) or g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
                bad.append(f"leaf {i}: {g!r} != {w!r}")
        elif g != w:
            bad.append(f"leaf {i}: {g!r} != {w!r}")
    return bad


# ---- what DCP's writer copies -----------------------------------------------------------------


class CountingWriter(FileSystemWriter):
    """A ``FileSystemWriter`` that records, in the process where ``write_data`` runs (the rank
    itself with the thread checkpointer, the background process with the process one), every
    tensor it writes: how many, their bytes, how many lie in a hostreg arena (in the
    background process: mapped from the rank's arena file, not copied), and every
    ``Tensor.clone`` the writer makes while writing (its loaders clone a tensor whose storage
    holds more than its bytes). Written as JSON to ``report``."""

    def __init__(self, path: str, report: str) -> None:
        super().__init__(path, thread_count=1)
        self.report = report

    def write_data(self, plan: Any, planner: Any) -> Any:
        from hostreg.torch import _sharing

        counts = {
            "pid": os.getpid(),
            "tensors": 0,
            "bytes": 0,
            "in_arena": 0,
            "bytes_in_arena": 0,
            "clones": 0,
            "bytes_cloned": 0,
        }
        me = threading.get_ident()
        resolve, clone = planner.resolve_data, torch.Tensor.clone

        def counting_resolve(item: Any) -> Any:
            obj = resolve(item)
            if isinstance(obj, torch.Tensor):
                t = obj.detach()
                counts["tensors"] += 1
                counts["bytes"] += t.nbytes
                if _sharing.staging_buffer_of(t) is not None:
                    counts["in_arena"] += 1
                    counts["bytes_in_arena"] += t.nbytes
            return obj

        def counting_clone(t: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
            if threading.get_ident() == me:
                counts["clones"] += 1
                counts["bytes_cloned"] += t.nbytes
            return clone(t, *a, **k)

        planner.resolve_data = counting_resolve
        torch.Tensor.clone = counting_clone  # type: ignore[method-assign]
        try:
            return super().write_data(plan, planner)
        finally:
            torch.Tensor.clone = clone  # type: ignore[method-assign]
            planner.resolve_data = resolve
            with open(self.report, "w") as f:
                json.dump(counts, f)
