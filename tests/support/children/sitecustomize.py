"""Started by every Python the Python suite starts that inherits its environment (the suite
puts this folder first on PYTHONPATH; tests/python/conftest.py): once ``torch`` or
``torch.distributed.checkpoint`` has been imported, the objects alive then are frozen
(``gc.freeze``), as ``hostreg stage`` does after its imports.

Why: every collection, the ones at interpreter exit included, otherwise walks the ~260,000
objects that importing torch makes, and a child pays that as it exits (about 0.4 s of CPU,
0.6 s with DCP imported): a quarter of a typical child's cost. What the
child's own code makes after the import is tracked and collected as before; nothing else
changes, the order of the child's imports included (the freeze follows whichever import of
the two comes first, and again after the other)."""

from __future__ import annotations

import gc
import importlib.machinery
import importlib.util
import os
import sys

_FREEZE_AFTER = {"torch", "torch.distributed.checkpoint"}


class _FreezeAfterImport:
    """A meta path finder that finds the modules above as the path finder does and freezes
    the collector's objects once a module's code has run."""

    @staticmethod
    def find_spec(name: str, path=None, target=None):
        if name not in _FREEZE_AFTER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module  # the loader is this module's own (one per spec)

        def exec_module(module):
            run(module)
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


sys.meta_path.insert(0, _FreezeAfterImport())
_run_the_next_sitecustomize()
