"""What the benchmarks in bench/ share: the state dicts they stage and save (plain ones of many
tensors, FSDP2-sharded GPT-2 with its AdamW state), the Ascend state DCP's DefaultStager is run
in, and a free port for a gloo process group. Imported by dcp_bench.py and save_bench.py."""

from __future__ import annotations

import gc
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

import hostreg.torch as ht
from hostreg.cli.models import GPT, MODELS

MiB = 1 << 20


# ---- state dicts ------------------------------------------------------------------------------


def plain_state_dict(count: int, nbytes: int) -> dict[str, Any]:
    """``{"model": {count fp32 tensors of nbytes}}``. Nested, as applications pass state dicts
    to DCP ({"model": ..., "optim": ...}): torch 2.13's async_save wraps every top-level value
    in a logging decorator in the caller's thread (_stateful_to_state_dict), about 40 us per
    top-level key whatever the stager, which a flat dict of 8,192 tensors would add to every
    "blocked" time alike."""
    return {"model": {f"t{i}": torch.full((nbytes // 4,), 0.5 + i % 7) for i in range(count)}}


def fsdp_state_dict(model_name: str, world: int) -> dict[str, Any]:
    """A GPT-shaped model sharded by FSDP2 over this process group, with AdamW state."""
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    with torch.device("meta"):
        model = GPT(MODELS[model_name])
    for block in model.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.to_local().fill_(0.01 * (1 + i % 5))
            p.grad = torch.zeros_like(p)
    opt.step()  # AdamW makes its state (exp_avg, exp_avg_sq, step) here
    opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def gpt_state_dict(name: str) -> dict[str, torch.Tensor]:
    """A GPT-shaped state dict with cheap, non-zero values (source memory made warm)."""
    with torch.device("meta"):
        model = GPT(MODELS[name])
    model.to_empty(device="cpu")
    sd = model.state_dict()
    for i, t in enumerate(sd.values()):
        t.fill_(0.5 + i % 7)
    return sd


def small_state_dict(count: int = 5000, nbytes: int = 16 * 1024) -> dict[str, torch.Tensor]:
    return {f"t{i}": torch.full((nbytes // 4,), float(i)) for i in range(count)}


def state_bytes(sd: Any) -> int:
    from torch.utils._pytree import tree_leaves

    total = 0
    for v in tree_leaves(sd):
        if isinstance(v, torch.Tensor):
            v = v.to_local() if hasattr(v, "to_local") else v
            total += v.nbytes
    return total


@contextmanager
def ascend_state() -> Iterator[None]:
    """torch.cuda.cudart() None (as under transfer_to_npu), hostreg's drop-in installed."""
    original = torch.cuda.cudart
    torch.cuda.cudart = lambda: None  # type: ignore[assignment]
    ht.install()
    try:
        yield
    finally:
        gc.collect()  # PyTorch's finalizers unpin through torch.cuda.cudart(): while installed
        ht.uninstall()
        torch.cuda.cudart = original  # type: ignore[assignment]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
