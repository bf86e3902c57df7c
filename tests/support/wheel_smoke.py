"""An installed hostreg, checked end to end by the Python that runs this file (any
architecture: scripts/test-wheels runs it with .venv's Python on x86_64 and with Debian's
aarch64 Python under qemu-user). Prints one JSON line; exits 1 at the first failure.

    python wheel_smoke.py [torch-first|hostreg-first] [SCRATCH_DIR]

- the import order given (torch, then hostreg, or the other way round): the wheels link
  LLVM's libc++ statically and hide it, so either order must work in one process;
- cudaHostRegister / cudaHostUnregister of an mmap: VmLck (/proc/self/status) rises by the
  size and falls back, a second registration answers cudaErrorHostMemoryAlreadyRegistered;
- where torch imports: a state dict staged by create_cpu_state_dict + copy_state_dict and by
  a Stager (equal values, the bytes locked while staged), saved twice (the second reusing the
  plan and layout) by hostreg's FileSystemWriter and SavePlanner with dcp.save and read back
  by dcp.load with torch's own FileSystemReader and with hostreg's reader and LoadPlanner,
  bit-exact;
- torch's own ``_create_cpu_state_dict(..., pin_memory=True, share_memory=True)`` with the
  drop-in installed: its tensors locked, and unlocked when freed;
- a DTensor staged by a Stager stays a DTensor, its local tensor pinned (in either import
  order: DTensor's module differs between torch versions, and is imported late).
"""

from __future__ import annotations

import importlib
import json
import mmap
import os
import platform
import sys
import tempfile


def vmlck_kib() -> int:
    """The process's locked memory, KiB (the kernel's own count)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    raise RuntimeError("no VmLck in /proc/self/status")


def check(cond: bool, what: str) -> None:
    if not cond:
        print(f"wheel_smoke: FAILED: {what}", file=sys.stderr)
        sys.exit(1)


def main() -> None:
    os.environ.setdefault("HOSTREG_LOG_LEVEL", "off")  # the 712 below is expected: no stderr line for it
    order = sys.argv[1] if len(sys.argv) > 1 else "hostreg-first"
    scratch = sys.argv[2] if len(sys.argv) > 2 else tempfile.mkdtemp(prefix="hostreg-smoke-")
    names = ["torch", "hostreg"] if order == "torch-first" else ["hostreg", "torch"]
    mods = {}
    for name in names:
        try:
            mods[name] = importlib.import_module(name)
        except ImportError as e:
            check(name == "torch", f"import {name}: {e}")
    import hostreg

    out: dict = {
        "machine": platform.machine(),
        "order": order,
        "hostreg": hostreg.__version__,
        "from": os.path.dirname(hostreg.__file__),
        "backend": hostreg.backend(),
    }

    # Registration, proven by the kernel's count.
    size = 4 << 20
    region = mmap.mmap(-1, size)
    import ctypes

    addr = ctypes.addressof(ctypes.c_char.from_buffer(region))
    rt = hostreg.cudart()
    before = vmlck_kib()
    check(int(rt.cudaHostRegister(addr, size, 0)) == 0, "cudaHostRegister of an mmap")
    locked = vmlck_kib() - before
    again = rt.cudaHostRegister(addr, size, 0)
    check(
        rt.cudaGetErrorName(int(again)) == "cudaErrorHostMemoryAlreadyRegistered", f"a second registration gave {again}"
    )
    check(int(rt.cudaHostUnregister(addr)) == 0, "cudaHostUnregister")
    check(vmlck_kib() == before, "VmLck back after cudaHostUnregister")
    check(locked == size >> 10, f"VmLck rose by {locked} KiB, not {size >> 10}")
    out["register_vmlck_kib"] = locked

    torch = mods.get("torch")
    if torch is not None:
        import torch.distributed.checkpoint as dcp

        import hostreg.torch as ht

        out["torch"] = torch.__version__
        g = torch.Generator().manual_seed(0)
        sd = {
            "w": torch.randn(512, 256, generator=g),
            "b": torch.arange(1000, dtype=torch.int64),
            "nested": {"h": torch.randn(3, 5, generator=g).to(torch.bfloat16)},
            "step": 7,
        }
        before = vmlck_kib()
        staged = ht.create_cpu_state_dict(sd, pin_memory=True)
        ht.copy_state_dict(sd, staged)
        check(
            torch.equal(staged["w"], sd["w"]) and torch.equal(staged["nested"]["h"], sd["nested"]["h"]),
            "copy_state_dict values",
        )
        check(vmlck_kib() - before >= (512 * 256 * 4) >> 10, "staged bytes locked")
        with ht.Stager() as stager:
            again_sd = stager.stage(sd)
            check(torch.equal(again_sd["b"], sd["b"]) and again_sd["step"] == 7, "Stager.stage values")
            ckpt = os.path.join(scratch, f"ckpt-{order}")
            dcp.save(again_sd, storage_writer=ht.FileSystemWriter(ckpt), planner=ht.SavePlanner())
            del again_sd
            sd["w"] += 1  # a second save of the structure: the planner's plan and the writer's layout reused
            again_sd = stager.stage(sd)
            dcp.save(again_sd, storage_writer=ht.FileSystemWriter(ckpt), planner=ht.SavePlanner())
            del again_sd
        back = {
            "w": torch.zeros(512, 256),
            "b": torch.zeros(1000, dtype=torch.int64),
            "nested": {"h": torch.zeros(3, 5, dtype=torch.bfloat16)},
            "step": 0,
        }
        dcp.load(back, storage_reader=dcp.FileSystemReader(ckpt))
        check(
            all(torch.equal(back[k], sd[k]) for k in ("w", "b"))
            and torch.equal(back["nested"]["h"], sd["nested"]["h"]),
            "dcp.load of hostreg's checkpoint, bit-exact",
        )
        back["w"].zero_()
        dcp.load(back, storage_reader=ht.FileSystemReader(ckpt), planner=ht.LoadPlanner())
        check(torch.equal(back["w"], sd["w"]), "hostreg's reader and LoadPlanner, bit-exact")
        del staged
        out["staged_and_saved"] = True
        out["torch_create_cpu_state_dict"] = torch_pins_through_the_drop_in(torch, ht, sd)
        stage_a_dtensor(torch, ht, scratch)
        out["dtensor_staged"] = True
    print(json.dumps(out))


def torch_pins_through_the_drop_in(torch, ht, sd: dict) -> dict:
    """torch's own ``_create_cpu_state_dict(sd, pin_memory=True, share_memory=True)`` (what
    DCP's staging calls; it reaches ``torch.cuda.cudart().cudaHostRegister``, or from torch 2.8
    ``torch.cuda._pin_memory_utils``, and fails on a CPU build without the drop-in), three
    times, each result dropped before the next (as a trainer restaging does): with
    ``install()`` its shared tensors are locked (VmLck). Returns whether the lock went once a
    result was dropped: torch 2.5's finalizer holds its tensor (``weakref.finalize(t, ...,
    t)``), so there it goes only at exit, where the drop-in must still answer; the drop-in
    stays installed for that."""
    import gc

    from torch.distributed._state_dict_utils import _create_cpu_state_dict

    before = vmlck_kib()
    ht.install()
    freed = []
    for _ in range(3):
        start = vmlck_kib()
        made = _create_cpu_state_dict(sd, pin_memory=True, share_memory=True)
        check(made["w"].shape == sd["w"].shape and made["w"].is_shared(), "torch's _create_cpu_state_dict, shared")
        check(vmlck_kib() - start >= (512 * 256 * 4) >> 10, "torch's _create_cpu_state_dict locked its tensors")
        del made
        gc.collect()
        freed.append(vmlck_kib() == before)
    return {"restaged": 3, "unlocked_when_dropped": all(freed)}


def stage_a_dtensor(torch, ht, scratch: str) -> None:
    """A DTensor (one rank over gloo, sharded on dim 0) staged by a Stager comes back a DTensor
    of the same mesh and placements whose local tensor is equal and lies in hostreg's pinned
    memory. torch 2.4 defines DTensor in torch.distributed._tensor, later ones in
    torch.distributed.tensor."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    except ImportError:  # torch < 2.5
        from torch.distributed._tensor import DTensor, Shard, distribute_tensor

    store = os.path.join(scratch, f"pg-{os.getpid()}")  # the scratch folder is shared by every run
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + store)
    try:
        mesh = init_device_mesh("cpu", (1,))
        d = distribute_tensor(torch.arange(64, dtype=torch.float32).reshape(8, 8), mesh, [Shard(0)])
        with ht.Stager() as stager:
            got = stager.stage({"d": d, "plain": torch.ones(3)})["d"]
            check(isinstance(got, DTensor), f"a staged DTensor came back as {type(got).__name__}")
            check(
                got.device_mesh == mesh and got.placements == d.placements, "the staged DTensor's mesh and placements"
            )
            check(torch.equal(got.to_local(), d.to_local()), "the staged DTensor's values")
            check(ht.is_pinned_by_hostreg(got.to_local()), "the staged DTensor's local tensor is pinned by hostreg")
            del got
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
