"""Started by every Python the Python suite starts that inherits its environment (the suite
puts this folder first on PYTHONPATH; tests/python/conftest.py): ``torch``,
``torch.distributed.checkpoint`` and ``torch._dynamo`` are imported with the garbage
collector paused, and the objects alive after the import are frozen (``gc.freeze``), as
``hostreg stage`` does.

Why: the ~260,000 objects that importing torch makes live until the process ends. Otherwise
the collections during the import walk them again and again (about 0.2 s of CPU; 0.45 s for
torch._dynamo), and every collection after it, the ones at interpreter exit included, walks
them all (about 0.4 s, 0.6 s with DCP): together about a third of a typical child's cost.
What the child makes after the import is collected as before; what it made before and still
holds is frozen with the import (a reference count still frees it, a collection no longer
does). The collector is left enabled or disabled as it was, and the order of the child's
imports is unchanged."""

from __future__ import annotations

import gc
import importlib.machinery
import importlib.util
import os
import sys

# torch._dynamo: torch.optim's optimizers import it when the first one is made (~1.3 s).
_FREEZE_AFTER = {"torch", "torch.distributed.checkpoint", "torch._dynamo"}


class _ImportForLife:
    """A meta path finder that finds the modules above as the path finder does, runs a
    module's code with the collector paused and freezes the collector's objects after it."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        if name not in _FREEZE_AFTER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module  # the loader is this module's own (one per spec)

        def exec_module(module):
            collecting = gc.isenabled()
            gc.disable()  # what the import makes lives as long as the process: no use looking
            try:
                run(module)
            finally:
                if collecting:
                    gc.enable()
            gc.freeze()

        spec.loader.exec_module = exec_module
        return spec


def _run_the_next_sitecustomize() -> None:
    """This file shadows a sitecustomize of the interpreter's own (Debian and Ubuntu ship
    one): that one still runs, as it would without the suite."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


sys.meta_path.insert(0, _ImportForLife())
_run_the_next_sitecustomize()
