"""FSDP2 training with hostreg's asynchronous checkpoints, killed and resumed bit for bit.

Two ranks on the CPU (gloo), one command each step::

    # 1. train 6 steps, checkpoint asynchronously after step 3, get killed during step 5
    #    (torchrun then reports the ranks' deaths with a ChildFailedError: expected)
    torchrun --nproc-per-node 2 examples/fsdp2_checkpoint.py /tmp/ckpt --crash-at 5
    # 2. resume from the checkpoint, train to step 6; then train 6 steps from scratch without
    #    a break and check that both runs end with the same bits
    torchrun --nproc-per-node 2 examples/fsdp2_checkpoint.py /tmp/ckpt --resume

What it shows (docs/quickstart.md):
- ``fully_shard`` on each layer and the model; ``get_state_dict`` / ``set_state_dict`` give
  the model's and the optimizer's sharded (DTensor) state.
- ``dcp.async_save`` with ``hostreg.torch.Stager(async_staging=True)`` (the shards copied
  into one shared, page-locked arena, reused by every save) and
  ``hostreg.torch.FileSystemWriter`` (``O_DIRECT`` from the arena); training goes on as soon
  as ``staging_completion`` is done. The writer replaces a checkpoint whole, so a crash
  during a save leaves the one before it.
- ``dcp.load`` with ``hostreg.torch.FileSystemReader`` and ``LoadPlanner``.

With an accelerator, move the model to it and pass ``device_mesh=init_device_mesh("cuda",
...)``; nothing else changes. Needs torch >= 2.6 (``fully_shard`` in
``torch.distributed.fsdp``) and numpy (DCP's collectives); ``pip install 'hostreg[torch]'``.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard

import hostreg.torch as ht

STEPS = 6
SAVE_AFTER = 3  # the step after which the checkpoint is taken


def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model (every rank starts from the same weights), sharded; and its optimizer."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(64, 64) for _ in range(4)))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """One step on this rank's batch for ``step`` (the same batch whenever the step is run)."""
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    x = torch.randn(8, 64, generator=g)
    optimizer.zero_grad()
    model(x).square().mean().backward()
    optimizer.step()


def digest(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """This rank's shards of the model and the optimizer's state, as plain tensors."""
    msd, osd = get_state_dict(model, optimizer)
    out = [v.to_local().clone() for v in msd.values()]
    for state in osd["state"].values():
        out += [v.to_local().clone() if hasattr(v, "to_local") else v.clone() for v in state.values()]
    return out


def train(directory: str, crash_at: int) -> None:
    model, optimizer = build()
    # The save's collectives (DCP's plan exchange) run in a background thread while training's
    # run in this one: on one process group they would interleave and hang. A group of its
    # own for checkpoints (gloo: CPU tensors) keeps them apart.
    checkpoint_group = dist.new_group(backend="gloo")
    with ht.Stager(async_staging=True) as stager:
        pending = None
        for step in range(1, STEPS + 1):
            if step == crash_at:
                if pending is not None:
                    pending.upload_completion.result()  # the checkpoint is complete on disk
                print(f"rank {dist.get_rank()}: killed during step {step}", flush=True)
                os._exit(1)  # as a kill would: no cleanup, no exit handlers
            train_step(model, optimizer, step)
            if step == SAVE_AFTER:
                msd, osd = get_state_dict(model, optimizer)
                pending = dcp.async_save(
                    {"model": msd, "optim": osd, "step": step},
                    storage_writer=ht.FileSystemWriter(directory),
                    async_stager=stager,
                    process_group=checkpoint_group,
                )
                pending.staging_completion.result()  # the arena holds the state: train on
        if pending is not None:
            pending.upload_completion.result()


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Whether every rank's tensors ``a`` and ``b`` are equal, bit for bit."""
    equal = len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))
    agreed = torch.tensor([int(equal)])
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return bool(agreed.item())


def resume(directory: str) -> None:
    model, optimizer = build()
    msd, osd = get_state_dict(model, optimizer)  # the structure to load into
    state = {"model": msd, "optim": osd, "step": 0}
    dcp.load(state, storage_reader=ht.FileSystemReader(directory), planner=ht.LoadPlanner())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    loaded = digest(model, optimizer)
    for step in range(state["step"] + 1, STEPS + 1):
        train_step(model, optimizer, step)
    resumed = digest(model, optimizer)

    model, optimizer = build()  # the same training without a break
    for step in range(1, STEPS + 1):
        train_step(model, optimizer, step)
        if step == SAVE_AFTER:
            at_save = digest(model, optimizer)
    ok = state["step"] == SAVE_AFTER and same(loaded, at_save) and same(resumed, digest(model, optimizer))
    if dist.get_rank() == 0:
        print(f"resumed from step {state['step']}: bit-identical to an unbroken run: {ok}")
    if not ok:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", help="the checkpoint's folder")
    parser.add_argument("--crash-at", type=int, default=0, help="die at the start of this step (1-6)")
    parser.add_argument("--resume", action="store_true", help="resume from the checkpoint and compare")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    try:
        resume(args.directory) if args.resume else train(args.directory, args.crash_at)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
