"""Step 5: device-to-host copy bandwidth into pageable, ``pin_memory``, hostreg-staged and
mlock-only memory (median of --repeats after --warmup copies), and the time to stage a
GPT-2-shaped state dict with PyTorch's path and hostreg's (bench/stage_bench.py's timings).

In a dry run (no GPU) the copies are CPU copies timed by the wall clock: rows are INFO, since
no target about a DMA engine can be judged on a CPU."""

from __future__ import annotations

import ctypes
import gc
import resource
import statistics
import sys
from typing import Any

from .checks import REPO, MiB
from .report import Row

TARGET_VS_PINNED = 0.95  # hostreg-staged D2H >= 0.95x torch pin_memory
TARGET_VS_PAGEABLE = 3.0  # hostreg-staged D2H >= 3x pageable
TARGET_STAGING = 3.0  # hostreg's time to a staged copy >= 3x faster than PyTorch's


def model(ctx: Any, name: str) -> dict:
    """A GPT-2-shaped state dict made on the device (meta, then to_empty: no slow init)."""
    from hostreg.cli.models import GPT, MODELS

    with ctx.torch.device("meta"):
        m = GPT(MODELS[name])
    sd = dict(m.to_empty(device=ctx.device).state_dict())
    with ctx.torch.no_grad():
        for t in sd.values():
            t.uniform_(-1, 1)
    return sd


def gbps(ctx: Any, srcs: list, dsts: list) -> float:
    """Median GB/s (1e9 bytes) of copying srcs (device) into dsts (host)."""

    def run() -> None:
        for s, d in zip(srcs, dsts):
            d.copy_(s, non_blocking=True)

    for _ in range(ctx.args.warmup):
        run()
        ctx.sync()
    times = [ctx.runtime.seconds(run) for _ in range(ctx.args.repeats)]
    return sum(s.nbytes for s in srcs) / statistics.median(times) / 1e9


def kinds(ctx: Any, sd: dict) -> dict[str, Any]:
    """D2H GB/s of sd's tensors into each kind of host memory, one kind at a time."""
    import hostreg.torch as ht

    torch, srcs = ctx.torch, list(sd.values())
    out: dict[str, Any] = {"pageable": gbps(ctx, srcs, [torch.empty_like(s, device="cpu") for s in srcs])}
    pin = not ctx.dry  # CPU-only torch cannot pin
    out["pin_memory"] = gbps(ctx, srcs, [torch.empty(s.shape, dtype=s.dtype, pin_memory=pin) for s in srcs])
    gc.collect()
    staged = ht.create_cpu_state_dict(sd)
    out["hostreg"] = gbps(ctx, srcs, [staged[k] for k in sd])
    out["hostreg pinned"] = all(ctx.runtime.is_pinned(staged[k]) for k in sd)
    del staged
    # mlock-only: one arena locked by the OS, not registered with CUDA (hostreg's posix way).
    offsets = [0]
    for s in srcs:  # each tensor at an ALIGNMENT boundary, as hostreg's arena places them
        offsets.append(offsets[-1] + -(-s.nbytes // ht.ALIGNMENT) * ht.ALIGNMENT)
    off = offsets[-1]
    arena = ht.Arena(off, pin=False, share=False)
    views = [arena.view(o, s.shape, s.dtype) for o, s in zip(offsets, srcs)]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mlock(ctypes.c_void_p(arena.data_ptr), ctypes.c_size_t(off)) == 0:
        out["mlock"] = gbps(ctx, srcs, views)
        libc.munlock(ctypes.c_void_p(arena.data_ptr), ctypes.c_size_t(off))
    else:
        out["mlock"] = (
            f"mlock({off:,}) failed, errno {ctypes.get_errno()} (RLIMIT_MEMLOCK {resource.getrlimit(resource.RLIMIT_MEMLOCK)})"
        )
    del views, arena
    gc.collect()
    ctx.log(f"D2H GB/s: {out}")
    return out


def judge(row: Row, ctx: Any, m: dict, against: str, target: float) -> None:
    ratio = m["hostreg"] / m[against]
    row.figure = f"{ratio:.2f}x (hostreg {m['hostreg']:.1f} vs {against} {m[against]:.1f} GB/s), target >= {target:g}x"
    if ctx.dry:
        row.result, row.figure = "INFO", row.figure + " (dry run: CPU copies, not judged)"
    else:
        row.result = "PASS" if ratio >= target and m["hostreg pinned"] else "FAIL"
        row.figure += "" if m["hostreg pinned"] else "; staged memory not pinned"


def step_bandwidth(ctx: Any, rows: dict[str, Row]) -> None:
    torch, a = ctx.torch, ctx.args
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft != hard:  # the mlock-only buffer
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
    one = {"x": torch.randint(0, 256, (a.size_mib * MiB,), dtype=torch.uint8, device=ctx.device)}
    measured = {"size": kinds(ctx, one), "model": kinds(ctx, model(ctx, a.model))}
    ctx.report.data["bandwidth"] = measured
    for (pin_row, page_row), m in zip((("5a", "5b"), ("5c", "5d")), measured.values()):
        judge(rows[pin_row], ctx, m, "pin_memory", TARGET_VS_PINNED)
        judge(rows[page_row], ctx, m, "pageable", TARGET_VS_PAGEABLE)
    rows["5e"].result = "INFO"
    rows["5e"].figure = (
        "; ".join(
            f"{m['mlock']:.1f} GB/s ({m['mlock'] / m['pin_memory']:.2f}x pin_memory) {k}"
            if isinstance(m["mlock"], float)
            else f"{k}: {m['mlock']}"
            for k, m in measured.items()
        )
        + " (no target)"
    )
    del one

    # 5f: time to a usable staged copy from the device, PyTorch's path against hostreg's.
    sys.path.insert(0, str(REPO / "bench"))
    from stage_bench import run_hostreg, run_torch

    import hostreg.torch as ht

    sd = model(ctx, a.model)
    was = ht.is_installed()
    ht.install()  # PyTorch's path pins through the drop-in where torch has no CUDA (dry run)
    try:
        run_torch(dict(list(sd.items())[:8]))  # warm-up: neither path is charged one-time setup
        t_torch, t_hostreg = run_torch(sd)["torch first"], run_hostreg(sd)["hostreg first"]
    finally:
        if not was:
            ht.uninstall()
    ctx.report.data["staging"] = {"torch_s": t_torch, "hostreg_s": t_hostreg}
    rows[
        "5f"
    ].figure = f"{t_torch / t_hostreg:.1f}x faster (hostreg {t_hostreg:.3g} s vs torch {t_torch:.3g} s), target >= {TARGET_STAGING:g}x"
    if ctx.dry:
        rows["5f"].result, rows["5f"].figure = "INFO", rows["5f"].figure + " (dry run: not judged)"
    else:
        rows["5f"].result = "PASS" if t_torch / t_hostreg >= TARGET_STAGING else "FAIL"
