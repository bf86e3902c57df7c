"""Step 4: the scenario that fails without CUDA (``torch.cuda.cudart()`` returning None, as
under Ascend's ``transfer_to_npu``) made to work by ``hostreg.torch.install()``, then
hostreg's own staging and ``Stager`` (sync, and async on a side stream), from the device."""

from __future__ import annotations

import gc
import io
from typing import Any

from .cuda import MEMORY_TYPE_HOST
from .report import Row


def state_dict(ctx: Any) -> dict:
    """docs/pytorch.md's scenario on the device, with non-tensor values and one larger tensor."""
    torch, dev = ctx.torch, ctx.device
    saved = io.BytesIO()
    torch.save(torch.arange(4.0), saved)
    saved.seek(0)
    return {
        "weight": torch.arange(10, dtype=torch.float32, device=dev),
        "bias": torch.ones(10, device=dev),
        "buffer": saved,
        "raw": saved.getvalue(),
        "step": torch.tensor(7.0, device=dev),
        "lr": 1.5,
        "nested": {"list": [1, "two", torch.full((3,), 3.0, device=dev)]},
        "big": torch.randn(1 << 20, device=dev),
    }


def tensors(sd: Any) -> list[Any]:
    from hostreg.torch._tree import flatten

    return flatten(sd)[0]


def differences(ctx: Any, src: dict, dst: dict) -> list[str]:
    bad = [
        f"tensor {tuple(s.shape)} differs"
        for s, d in zip(tensors(src), tensors(dst))
        if not ctx.torch.equal(s.cpu(), d)
    ]
    if (dst["lr"], dst["raw"], dst["nested"]["list"][:2], dst["buffer"].getvalue()) != (
        1.5,
        src["raw"],
        [1, "two"],
        src["raw"],
    ):
        bad.append("non-tensor values differ")
    return bad


def step_scenario(ctx: Any, rows: dict[str, Row]) -> None:
    from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

    import hostreg
    import hostreg.torch as ht

    torch, rt, sd = ctx.torch, ctx.runtime, state_dict(ctx)
    regs0 = hostreg.stats().registrations

    def left() -> list[str]:
        gc.collect()
        n = hostreg.stats().registrations - regs0
        return [f"{n} registrations left"] if n else []

    # 4a: PyTorch's own shared+pinned path with cudart() returning None, through the drop-in.
    problems: list[str] = []
    was_installed, original = ht.is_installed(), torch.cuda.cudart
    ht.uninstall()
    torch.cuda.cudart = lambda: None
    try:
        ht.install()
        cpu = _create_cpu_state_dict(sd, share_memory=True, pin_memory=True)
        _copy_state_dict(sd, cpu)
        ctx.sync()
        ts = [t for t in tensors(cpu) if t.dim() > 0]  # PyTorch leaves 0-d tensors unpinned
        ptrs, live = [t.data_ptr() for t in ts], hostreg.stats().registrations - regs0
        problems += differences(ctx, sd, cpu)
        problems += [] if all(rt.is_pinned(t) and t.is_shared() for t in ts) else ["not all pinned and shared"]
        problems += [] if live == len(ts) else [f"{live} registrations for {len(ts)} tensors"]
        del cpu, ts
        problems += left()  # PyTorch's finalizers unregister through the drop-in
        problems += [f"runtime still sees {p:#x} as Host" for p in ptrs if rt.memory_type(p)[1] == MEMORY_TYPE_HOST]
    finally:
        ht.uninstall()
        torch.cuda.cudart = original
        if was_installed:
            ht.install()
    rows["4a"].judge(problems, f"{len(ptrs)} tensors pinned+shared through the drop-in, values equal, 0 left after gc")

    # 4b: hostreg's staging: one arena, one registration.
    staged = ht.create_cpu_state_dict(sd)
    ht.copy_state_dict(sd, staged)
    ts = tensors(staged)
    problems = differences(ctx, sd, staged) + ([] if all(rt.is_pinned(t) for t in ts) else ["not all pinned"])
    problems += [] if hostreg.stats().registrations - regs0 == 1 else ["not one registration"]
    del staged, ts
    rows["4b"].judge(problems + left(), "one registration, every tensor pinned, values equal, 0 left after gc")

    # 4c / 4d: Stager, twice into one arena; then async: a Future, copies on a stream of its own
    # after the work the caller queued before stage().
    for rid, async_staging in (("4c", False), ("4d", True)):
        problems = []
        stager = ht.Stager(async_staging=async_staging)
        try:
            for i in range(2):
                with torch.no_grad():
                    for t in tensors(sd):
                        t.mul_(3)  # queued just before stage(): must be in the copy
                out = stager.stage(sd)
                out = out.result(timeout=120) if async_staging else out
                ctx.sync()
                problems += [f"save {i}: {p}" for p in differences(ctx, sd, out)]
                problems += [] if all(rt.is_pinned(t) for t in tensors(out)) else [f"save {i} not pinned"]
                del out
            problems += [] if stager.arenas_created == 1 else [f"{stager.arenas_created} arenas for 2 saves"]
            if async_staging and not ctx.dry:
                side = stager._stream
                problems += (
                    []
                    if side is not None and side.stream_id != torch.cuda.current_stream().stream_id
                    else ["no side stream"]
                )
        finally:
            stager.close()
        what = "Future, side stream after the caller's queued work" if async_staging else "stage()"
        rows[rid].judge(problems + left(), f"{what}: twice into 1 arena, values right, pinned, 0 left after close")
