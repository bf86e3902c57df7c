"""Load a DCP checkpoint's weights straight into page-locked (pinned) host memory.

    python examples/load_pinned.py [CHECKPOINT_DIR]

Without an argument it first writes a checkpoint of a small model to a temporary folder
(as a training job would). Then, as an inference server would:

1. the model is made on the ``meta`` device: shapes and dtypes, no memory;
2. ``hostreg.torch.create_cpu_state_dict(template, pin_memory=True)`` places every tensor in
   one shared arena, page-locked by one registration (the accelerator's runtime where there
   is one, ``mlock`` on a host without);
3. ``dcp.load`` with ``hostreg.torch.FileSystemReader`` and ``LoadPlanner`` reads the
   checkpoint into it (``O_DIRECT`` where the file system allows);
4. the weights go to the device with ``non_blocking=True`` copies (from pinned memory they
   are real asynchronous DMA), or on a host without an accelerator are used in place.

It prints what is locked (``VmLck`` of /proc/self/status) and checks the loaded weights
against the ones that were saved. Needs torch >= 2.4; ``pip install 'hostreg[torch]'``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile

import torch
import torch.distributed.checkpoint as dcp

import hostreg
import hostreg.torch as ht


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))


def main() -> None:
    torch.manual_seed(0)
    saved = None
    if len(sys.argv) > 1:
        directory = sys.argv[1]
    else:  # a training job's checkpoint
        directory = tempfile.mkdtemp(prefix="load_pinned-")
        saved = make_model().state_dict()
        dcp.save(saved, storage_writer=ht.FileSystemWriter(directory), no_dist=True)
    try:
        with torch.device("meta"):
            model = make_model()  # no memory yet
        weights = ht.create_cpu_state_dict(model.state_dict(), pin_memory=True)
        dcp.load(weights, storage_reader=ht.FileSystemReader(directory), planner=ht.LoadPlanner(), no_dist=True)
    finally:
        if saved is not None:
            shutil.rmtree(directory)
    print(
        f"{sum(t.nbytes for t in weights.values()):,} bytes loaded into pinned memory; "
        f"pinned by hostreg: {all(ht.is_pinned_by_hostreg(t) for t in weights.values())}; "
        f"VmLck {hostreg.locked_bytes():,} bytes; backend {hostreg.backend()}"
    )
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None and accelerator.is_available():
        device = accelerator.current_accelerator()
        weights = {k: v.to(device, non_blocking=True) for k, v in weights.items()}
        accelerator.synchronize()
    model.load_state_dict(weights, assign=True)  # the meta parameters replaced by the loaded tensors
    print(model(torch.randn(2, 256, device=next(model.parameters()).device)).shape)
    if saved is not None:
        same = all(torch.equal(model.state_dict()[k].cpu(), v) for k, v in saved.items())
        print(f"weights equal the saved ones: {same}")
        if not same:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
