"""The saves and loads of test_crash_matrix.py, each in a process of a forkserver that has
torch, DCP and hostreg imported (a fork per case instead of a new interpreter).

A save (:func:`save_rank`, one process per rank) counts the writer's steps that change the
disk: each write of the C core (``hostregFileWrite``: a part of a file, ``parts.py``), each
``os.unlink`` (metadata removed before data is written) and each ``os.replace`` (the metadata
put in place); after step ``kill_at`` of rank ``kill_rank`` it kills every rank of the save
with SIGKILL, as a crashing node would. :func:`load_ranks` then loads each rank's state dict as
that rank's ``dcp.load`` would (``.metadata``, else ``__{rank}.metadata``) with hostreg's
reader and DCP's, and says for each whether it raised, gave one save's values exactly, or
anything else."""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from typing import Any

N = 5  # tensors per rank
SIZE = 300  # elements per tensor


def state(save: int, rank: int) -> dict:
    import torch

    return {f"r{rank}.t{k}": torch.full((SIZE,), float(save * 1000 + rank * 100 + k)) for k in range(N)}


def save_rank(
    rank: int,
    world: int,
    port: int,
    path: str,
    save: int,
    collectives: bool,
    kill: tuple[int, int],
    conn: Any,
    out: str,
) -> None:
    """Saves ``state(save, rank)`` into ``path`` as rank ``rank`` of ``world``; writes the
    number of steps it took to ``out``; SIGKILLs every rank (pids from ``conn``) after step
    ``kill[1]`` of rank ``kill[0]``."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import hostreg.torch as ht
    from hostreg import _hostreg
    from hostreg.torch._checkpoint import parts

    pids = conn.recv()
    parts.PART_ITEMS, parts.PART_BYTES = 2, 1  # a part every 2 tensors: several writes a file
    steps = [0]

    def counted(fn: Any) -> Any:
        def step(*a: Any, **k: Any) -> Any:
            try:
                return fn(*a, **k)
            finally:
                steps[0] += 1
                if rank == kill[0] and steps[0] == kill[1]:
                    for pid in pids:
                        if pid != os.getpid():
                            os.kill(pid, signal.SIGKILL)
                    os.kill(os.getpid(), signal.SIGKILL)

        return step

    _hostreg.file_write = counted(_hostreg.file_write)
    os.unlink = counted(os.unlink)
    os.replace = counted(os.replace)
    if world > 1:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
        )
    dcp.save(
        state(save, rank), storage_writer=ht.FileSystemWriter(path), use_collectives=collectives, no_dist=world == 1
    )
    with open(out, "w") as f:
        json.dump(steps[0], f)
    os._exit(0)  # no atexit work, no process group teardown: the save is what was tested


def load_ranks(path: str, world: int, saves: tuple[int, ...], out: str) -> None:
    """Writes to ``out`` {reader: [per rank: [outcome, which metadata]]}: outcome "raised",
    the save whose values every tensor holds, or "mixed"."""
    import torch
    import torch.distributed.checkpoint as dcp

    import hostreg.torch as ht

    result: dict[str, list] = {}
    for name, base in (("hostreg", ht.FileSystemReader), ("stock", dcp.FileSystemReader)):
        result[name] = []
        for rank in range(world):
            used = ["global"]

            class AsRank(base):  # type: ignore[misc, valid-type]
                def read_metadata(self, *args: Any, **kwargs: Any) -> Any:  # DCP looks for "kwargs"
                    if "rank" in kwargs:  # DCP's fallback to a rank's own metadata
                        kwargs["rank"] = rank
                        used[0] = "rank"
                    return super().read_metadata(*args, **kwargs)

            dest = {f"r{rank}.t{k}": torch.zeros(SIZE) for k in range(N)}
            try:
                dcp.load(dest, storage_reader=AsRank(path), no_dist=True)
            except BaseException:  # DCP raises CheckpointException, a BaseException
                result[name].append(["raised", used[0]])
                continue
            whole = [s for s in saves if all(torch.equal(v, state(s, rank)[k]) for k, v in dest.items())]
            result[name].append([whole[0] if whole else "mixed", used[0]])
    with open(out, "w") as f:
        json.dump(result, f)
    os._exit(0)
