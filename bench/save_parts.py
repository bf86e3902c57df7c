"""bench/save_bench.py's parts: the writers it compares, the machine's page cache, the state
dicts it saves and loads, and one timed save. Imported by save_bench.py (run that)."""

from __future__ import annotations

import os
import pickle
import subprocess
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from common import plain_state_dict
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

import hostreg.torch as ht


class NoStorage(StorageWriter):
    """A DCP StorageWriter that stores nothing: what dcp.async_save costs on its own (planning,
    staging, resolve_data of every item, the metadata pickled in memory), the floor under every
    writer's "done" time. Its directory is left empty and is never loaded."""

    def __init__(self, path: str) -> None:
        super().__init__()
        os.makedirs(path, exist_ok=True)

    def reset(self, checkpoint_id: Any = None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: Any) -> Any:
        return plan

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        return plans

    def write_data(self, plan: Any, planner: Any) -> Future:
        for item in plan.items:
            planner.resolve_data(item)
        fut: Future = Future()
        fut.set_result([WriteResult(index=i.index, size_in_bytes=0, storage_data=None) for i in plan.items])
        return fut

    def finish(self, metadata: Any, results: Any) -> None:
        pickle.dumps(metadata)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return True


FLOOR = "DCP's own work, nothing stored"
DCP1 = "DCP writer tc=1 (default)"
DCP2 = "DCP writer tc=2"
HR = "hostreg writer (default: tc per disk)"
WRITERS: list[tuple[str, Callable[[str], Any]]] = [
    (FLOOR, NoStorage),
    (DCP1, lambda d: dcp.FileSystemWriter(d, thread_count=1)),
    (DCP2, lambda d: dcp.FileSystemWriter(d, thread_count=2)),
    (HR, lambda d: ht.FileSystemWriter(d)),
    ("hostreg writer tc=1", lambda d: ht.FileSystemWriter(d, thread_count=1)),
    ("hostreg writer tc=2", lambda d: ht.FileSystemWriter(d, thread_count=2)),
    ("hostreg writer tc=4", lambda d: ht.FileSystemWriter(d, thread_count=4)),
    ("hostreg writer tc=8", lambda d: ht.FileSystemWriter(d, thread_count=8)),
]
LOAD_FROM = {HR: "hostreg's", DCP1: "DCP tc=1's"}  # checkpoints that are also loaded, and their short names
READERS = ["stock dcp.load", "hostreg reader"]


# ---- the machine -------------------------------------------------------------------------------


class Host:
    """Page-cache dropping and /proc/meminfo; remembers whether dropping ever failed."""

    def __init__(self) -> None:
        self.drop_failed: str | None = None

    def drop_caches(self) -> None:
        os.sync()
        if self.drop_failed:
            return
        try:
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("1")
        except OSError as e:
            self.drop_failed = e.strerror or str(e)

    @staticmethod
    def meminfo() -> dict[str, int]:
        out = {}
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                out[key] = int(rest.split()[0]) * 1024  # kB
        return out


def resident_bytes(directory: str) -> int | None:
    """Bytes of the files in ``directory`` that are in the page cache (fincore: mincore), or None
    without fincore. Unlike Cached, not moved by library pages read back after drop_caches."""
    files = [os.path.join(directory, f) for f in sorted(os.listdir(directory))]
    try:
        p = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES", *files], capture_output=True, text=True
        )
    except OSError:
        return None
    if p.returncode != 0:
        return None
    return sum(int(x) for x in p.stdout.split())


# ---- state dicts -------------------------------------------------------------------------------


def random_state_dict(count: int, total: int, seed: int) -> dict[str, Any]:
    """dcp_bench's ``{"model": {count fp32 tensors}}`` of ``total`` bytes, refilled with uniform
    random values (each tensor its own, from one seeded generator: equality checks mean
    something; torch.randn would take minutes for 2 GiB on 2 cores)."""
    sd = plain_state_dict(count, total // count)
    gen = torch.Generator().manual_seed(seed)
    for t in sd["model"].values():
        t.uniform_(-1.0, 1.0, generator=gen)
    return sd


def zeros_like_sd(sd: dict[str, Any]) -> dict[str, Any]:
    dest = {"model": {k: torch.zeros_like(v) for k, v in sd["model"].items()}}
    for t in dest["model"].values():  # the memory touched: a page fault is not part of a load
        t.fill_(1.0)
        t.zero_()
    return dest


def copy_structure(sd: Any) -> Any:
    """A state dict like ``sd`` with tensors of its own (DTensors over the same mesh and
    placements): a destination to load into."""
    import copy

    from torch.distributed.tensor import DTensor
    from torch.utils._pytree import tree_map

    def one(v: Any) -> Any:
        if isinstance(v, DTensor):
            return DTensor.from_local(
                v.to_local().clone(), v.device_mesh, v.placements, shape=v.shape, stride=v.stride(), run_check=False
            )
        return v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)

    return tree_map(one, sd)


def verify(src: list[torch.Tensor], dest: list[torch.Tensor], what: str) -> None:
    bad = [i for i, (a, b) in enumerate(zip(src, dest)) if not torch.equal(a, b)]
    if bad or len(src) != len(dest):
        raise RuntimeError(
            f"{what}: {len(bad)} of {len(src)} tensors differ from the source after the load (first: {bad[:5]})"
        )


# ---- one case ----------------------------------------------------------------------------------


def one_save(sd: dict[str, Any], stager: Any, path: str, writer: Any, pg: Any = None) -> tuple[float, float]:
    t0 = time.perf_counter()
    res = dcp.async_save(sd, checkpoint_id=path, storage_writer=writer, async_stager=stager, process_group=pg)
    if not isinstance(res, state_dict_saver.AsyncSaveResponse):
        raise RuntimeError(
            f"dcp.async_save returned {type(res).__name__}, not an AsyncSaveResponse: "
            "this torch does not take a staging future"
        )
    res.staging_completion.result()
    staged = time.perf_counter() - t0
    res.upload_completion.result()
    done = time.perf_counter() - t0
    del res
    return staged, done


class Ranks:
    """The processes of one case: this one alone, or a gloo process group (every rank runs
    the same saves and loads; rank 0 alone drops caches, reads /proc/meminfo, removes files)."""

    def __init__(self, pg: Any = None) -> None:
        self.pg = pg
        self.root = pg is None or dist.get_rank() == 0

    def barrier(self) -> None:
        if self.pg is not None:
            dist.barrier(group=self.pg)

    def total(self, n: int) -> int:
        """The sum of ``n`` over the ranks."""
        if self.pg is None:
            return n
        t = torch.tensor([n], dtype=torch.int64)
        dist.all_reduce(t, group=self.pg)
        return int(t.item())


def tensors_of(sd: Any) -> list[torch.Tensor]:
    """Every tensor of a (possibly FSDP2) state dict, DTensors as their local shards, in order."""
    from torch.utils._pytree import tree_leaves

    return [v.to_local() if hasattr(v, "to_local") else v for v in tree_leaves(sd) if isinstance(v, torch.Tensor)]
