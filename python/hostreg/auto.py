"""``import hostreg.auto``: install hostreg's ``torch.cuda.cudart()`` drop-in, no other code.

Importing this module calls :func:`hostreg.torch.install` as soon as ``torch.cuda`` exists:
at once if torch is already imported, else right after torch imports it (an import hook;
importing hostreg.auto does not import torch). Real CUDA is kept wherever it works.

The same happens at interpreter start, for unmodified scripts, when the environment
variable ``HOSTREG_AUTO_INSTALL=1`` is set: the ``hostreg-auto.pth`` file that the wheel
places in site-packages imports this module then, and does nothing at all otherwise.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import Any


def _install() -> None:
    from ._dropin import install  # not hostreg.torch: that may be the module importing torch now

    install()


class _AfterTorchCuda(importlib.abc.MetaPathFinder):
    """Runs :func:`_install` right after ``torch.cuda`` has been executed, then removes itself."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != "torch.cuda" or getattr(_searching, "active", False):
            return None  # re-entered: another finder (or a reloaded copy of this one) asked
        _searching.active = True
        try:
            return self._find(name, path, target)
        finally:
            _searching.active = False

    def _find(self, name: str, path: Sequence[str] | None, target: ModuleType | None) -> Any:
        for finder in sys.meta_path:
            if isinstance(finder, _AfterTorchCuda):
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                exec_module = spec.loader.exec_module

                def exec_then_install(module: ModuleType) -> None:
                    exec_module(module)
                    _remove_hook()
                    _install()

                spec.loader.exec_module = exec_then_install
                return spec
        return None


_searching = threading.local()
_hook = _AfterTorchCuda()


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterTorchCuda)]


if "torch.cuda" in sys.modules:
    _install()
elif not any(isinstance(f, _AfterTorchCuda) for f in sys.meta_path):
    sys.meta_path.insert(0, _hook)
