"""Steps 1-3: the build imports, hostreg answers as the CUDA runtime does, and what it
registers is registered for CUDA and torch."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from .cuda import MEMORY_TYPE_HOST
from .report import Row

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))  # tests/support/bad_inputs.py: the cases both suites run
MiB = 1 << 20


def step_build(ctx: Any, rows: dict[str, Row]) -> None:
    """1a: the build (gpu_check.sh's verdict); 1b: hostreg imports without rich, from the build."""
    a = ctx.args
    rows["1a"].result = a.build_status or "INFO"
    rows["1a"].figure = a.build_detail or "not built by gpu_check.sh (hostreg as found on sys.path)"
    code = (
        "import sys; sys.modules['rich'] = None  # any `import rich` now raises ImportError\n"
        "import hostreg, hostreg.torch, hostreg.cli.models\nprint(hostreg.__file__); print(hostreg.backend())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=os.environ)
    ctx.log(f"import check rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    if r.returncode != 0:
        rows["1b"].figure = "import failed without rich: " + (r.stderr.strip().splitlines() or ["?"])[-1]
        return
    init, backend = r.stdout.splitlines()[:2]
    problems = []
    if a.expect_package and Path(init).resolve().parent != Path(a.expect_package).resolve():
        problems.append(f"imported {init}, not the build in {a.expect_package}")
    if backend != "cuda":
        problems.append(f"backend is {backend!r}, not 'cuda'")
    rows["1b"].judge(problems, f"ok from {Path(init).parent} (backend cuda, rich not needed)")


def step_differential(ctx: Any, rows: dict[str, Row]) -> None:
    """2: every register/unregister case of the bad-input matrix, sent to the CUDA runtime and
    to hostreg's cuda backend (each on memory of its own); every answer must be the same."""
    from support import bad_inputs

    import hostreg

    if hostreg.backend() != "cuda":
        raise RuntimeError(f"hostreg's backend is {hostreg.backend()!r}, not cuda: {hostreg.last_error().message}")

    regs0, lines, diffs, left = hostreg.stats().registrations, [], [], []
    for name in bad_inputs.CASES:
        theirs, left_rt = bad_inputs.run(name, ctx.runtime.register, ctx.runtime.unregister)
        ours, left_hr = bad_inputs.run(name, hostreg.host_register, hostreg.host_unregister)
        left += [f"{side} {name}" for side, n in (("runtime", left_rt), ("hostreg", left_hr)) if n]
        mark = "   " if theirs == ours else "!= "
        lines.append(f"{mark}{name:<34} runtime={theirs:<28} hostreg={ours}")
        if theirs != ours:
            diffs.append(f"{name}: runtime {theirs}, hostreg {ours}")
    ctx.log("differential cases (!= marks a difference):\n" + "\n".join(lines))
    ctx.report.data["differential"] = lines
    for d in diffs:
        ctx.report.say(f"  DIFF {d}")
    problems = diffs[:3] + ([f"{len(diffs)} of {len(lines)} answers differ"] if diffs else [])
    problems += [f"cases left registrations (undone): {', '.join(left)}"] if left else []
    if hostreg.stats().registrations != regs0:
        problems.append(f"hostreg holds {hostreg.stats().registrations - regs0} registrations afterwards")
    rows["2"].judge(problems, f"{len(lines)}/{len(lines)} answers equal ({Path(ctx.runtime.path).name})")
    if ctx.dry and not left:  # a test double is no reference: its differences are findings to read
        rows["2"].result = "INFO"
        rows["2"].figure = f"{len(lines) - len(diffs)}/{len(lines)} answers equal to the CUDA driver double" + (
            f"; differ: {', '.join(d.split(':')[0] for d in diffs)} (dry run: the real runtime decides)"
            if diffs
            else ""
        )


def step_registration(ctx: Any, rows: dict[str, Row]) -> None:
    """3: memory hostreg registers is Host memory to the runtime and pinned to torch, a D2H copy
    lands in it byte for byte, and neither holds after unregistering; the same for an arena."""
    import hostreg
    import hostreg.torch as ht

    torch, rt, n = ctx.torch, ctx.runtime, 8 * MiB
    raw = torch.empty(n + 4096, dtype=torch.uint8)
    ptr = raw.data_ptr() + 100  # need not be page-aligned
    t = raw[100 : 100 + n]
    problems: list[str] = []

    def expect(cond: bool, what: str) -> None:
        problems.extend([] if cond else [what])

    expect(rt.memory_type(ptr)[1] != MEMORY_TYPE_HOST and not rt.is_pinned(t), "registered before register")
    try:
        expect(hostreg.host_register(ptr, n, hostreg.HostRegisterFlags.Portable) == 0, "host_register failed")
        reg, mt, flags = hostreg.registration(ptr), rt.memory_type(ptr), rt.host_flags(ptr)
        ctx.log(f"registered: hostreg {reg}; runtime memory type {mt}, host flags {flags}")
        expect(mt[0] == 0 and mt[1] == MEMORY_TYPE_HOST, f"runtime memory type {mt}, not Host")
        expect(flags[0] == 0, f"cudaHostGetFlags answers {flags[0]}")
        expect(rt.is_pinned(t), "is_pinned() False while registered")
        expect(reg is not None and reg.backend == "cuda", f"hostreg.registration: {reg}")
        if reg is not None and mt[2]:
            expect(reg.device_ptr == mt[2], f"device pointer: hostreg {reg.device_ptr:#x}, runtime {mt[2]:#x}")
        src = torch.randint(0, 256, (n,), dtype=torch.uint8, device=ctx.device)
        t.copy_(src, non_blocking=True)
        ctx.sync()
        expect(torch.equal(t, src.cpu()), "D2H copy into the registered memory differs")
        expect(hostreg.host_unregister(ptr) == 0, "host_unregister failed")
        expect(rt.memory_type(ptr)[1] != MEMORY_TYPE_HOST and not rt.is_pinned(t), "still registered after unregister")
    finally:
        if hostreg.registration(ptr) is not None:  # a check failed half-way
            hostreg.host_unregister(ptr)
    arena = ht.Arena(4 * MiB, pin=True, share=True)
    view = arena.view(0, (4 * MiB,), torch.uint8)
    in_arena = rt.is_pinned(view)
    arena.close()
    expect(
        in_arena and not rt.is_pinned(view), f"staging arena: is_pinned {in_arena} -> {rt.is_pinned(view)} after close"
    )
    del view, arena, t, raw
    gc.collect()
    rows["3"].judge(problems, "Host memory to the runtime, is_pinned True -> False after unregister; arena too")
