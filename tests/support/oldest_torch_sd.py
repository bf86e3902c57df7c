"""The state dict of the oldest-torch round trips, built and hashed the same way by the torch
under test (2.13, natively) and by torch 2.4.0 (aarch64, under qemu): no numpy, no hostreg,
only what torch 2.4 has. Run as a script under torch 2.4 it saves with DCP's own
FileSystemWriter, or loads with DCP's own reader and converts with its ``dcp_to_torch_save``
(see main), printing a JSON line of every entry's SHA-256 (its raw bytes, shape and dtype)."""

from __future__ import annotations

import hashlib
import json
import sys

import torch

SHAPES = {  # name: (dtype, shape); one tensor past 256 KiB (written straight from its memory)
    "w.f32": (torch.float32, (300, 257)),
    "w.bf16": (torch.bfloat16, (7, 9)),
    "w.f16": (torch.float16, (33,)),
    "w.f64": (torch.float64, ()),
    "w.i64": (torch.int64, (5, 4, 3)),
    "w.i8": (torch.int8, (1000,)),
    "w.u8": (torch.uint8, (4096,)),
    "w.bool": (torch.bool, (17,)),
    "w.c64": (torch.complex64, (6,)),
    "w.empty": (torch.float32, (0, 3)),
}


def build(seed: int) -> dict:
    """Tensors of SHAPES with values from torch's CPU generator (the same on any machine
    for a seed), a nested dict and two non-tensor items (DCP's byte items)."""
    g = torch.Generator().manual_seed(seed)
    flat = {}
    for name, (dtype, shape) in SHAPES.items():
        if dtype.is_floating_point or dtype.is_complex:
            t = torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
            if dtype.is_complex:
                t = torch.complex(torch.randn(shape, generator=g), torch.randn(shape, generator=g)).to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, shape, generator=g).bool()
        else:
            t = torch.randint(-100 if dtype.is_signed else 0, 100, shape, generator=g).to(dtype)
        flat[name] = t
    return {"model": flat, "step": 1234 + seed, "note": f"seed {seed}"}


def digest(sd: dict) -> dict:
    """Every entry's SHA-256 of its bytes, with its dtype and shape; other values by repr."""
    out = {}
    for name, t in sd["model"].items():
        raw = t.contiguous().reshape(-1).view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)
        out[name] = [str(t.dtype), list(t.shape), hashlib.sha256(bytes(raw.tolist())).hexdigest()]
    out["step"] = repr(sd["step"])
    out["note"] = repr(sd["note"])
    return out


def empty_like(sd: dict) -> dict:
    """A destination of sd's structure whose bytes all differ from any load (ones of each
    dtype; zeros are as likely as any value to be right)."""
    return {"model": {k: torch.ones_like(v) for k, v in sd["model"].items()}, "step": 0, "note": ""}


def main(argv: list[str]) -> None:
    """``load PATH SEED PT``: DCP's own reader loads PATH into a destination of build(SEED)'s
    structure, and its converter writes PATH as one torch.save file PT. ``save PATH SEED``:
    DCP's own writer saves build(SEED) to PATH. Several actions may follow one another in
    one run (``load ... save ...``: torch starts once). Prints one JSON line: the torch
    version and each action's digests."""
    import torch.distributed.checkpoint as dcp

    out: dict = {"torch": torch.__version__}
    while argv:
        what = argv.pop(0)
        if what == "save":  # DCP's own writer, this torch's format
            path, seed = argv.pop(0), int(argv.pop(0))
            sd = build(seed)
            # One process: DCP assumes no_dist (2.4 has no such argument).
            dcp.save(sd, storage_writer=dcp.FileSystemWriter(path))
            out["saved"] = digest(sd)
        elif what == "load":  # DCP's own reader, then its converter to one torch.save file
            from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

            path, seed, pt = argv.pop(0), int(argv.pop(0)), argv.pop(0)
            sd = empty_like(build(seed))
            dcp.load(sd, storage_reader=dcp.FileSystemReader(path))
            out["loaded"] = digest(sd)
            dcp_to_torch_save(path, pt)
            out["converted"] = digest(torch.load(pt, weights_only=False))
        else:
            raise SystemExit(f"unknown action {what!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")  # torch 2.4 warns that numpy is missing, and that no_dist is assumed
    main(sys.argv[1:])
