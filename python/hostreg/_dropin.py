"""The ``torch.cuda.cudart()`` drop-in (re-exported by :mod:`hostreg.torch`).

PyTorch's shared+pinned state-dict path (``_create_cpu_state_dict(..., share_memory=True,
pin_memory=True)``, DCP staging) calls ``torch.cuda.cudart().cudaHostRegister(ptr, size, 1)``
directly (``docs/pytorch.md``). Without CUDA ``cudart()`` raises
``AssertionError("Torch not compiled with CUDA enabled")`` or, under Ascend's
``transfer_to_npu``, returns ``None``. :func:`install` wraps ``torch.cuda.cudart`` so those
two cases answer :func:`hostreg.cudart` instead; real CUDA is kept where it works, and every
other exception (e.g. the ``RuntimeError`` of a bad fork) propagates.

``torch.cuda.check_error`` and ``torch.cuda.CudaError`` read the module global
``torch.cuda._cudart``, which a CPU build of torch leaves ``None`` (so ``check_error`` raised
``AttributeError`` even for success, and callers such as DeepSpeed's CUDA accelerator lost
track of a registration). On such a build :func:`install` sets it to :func:`hostreg.cudart`
too.

This module imports neither torch nor hostreg's staging code, so ``hostreg.auto`` can
install the drop-in while torch itself is still being imported.
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from typing import Any, Callable

from . import _core, _hostreg
from ._cudart import cudart as _hostreg_cudart

# AssertionError messages of torch.cuda._lazy_init that mean "no CUDA runtime here".
_NO_CUDA = ("Torch not compiled with CUDA enabled", "libcudart functions unavailable")

_original: Callable[[], Any] | None = None  # torch.cuda.cudart before install()
_original_is_pinned: Callable[..., bool] | None = None  # torch.Tensor.is_pinned before install()
_is_pinned_wrapper: Callable[..., bool] | None = None  # what install() put there


def registered_by_hostreg(tensor: Any) -> bool:
    """Whether a CPU tensor's first byte lies in a live hostreg registration."""
    if not tensor.is_cpu:
        return False
    try:
        ptr = tensor.data_ptr()
    except RuntimeError:  # no storage (sparse, ...)
        return False
    return bool(ptr) and _hostreg.is_registered(ptr)


def _wrap_is_pinned(original: Callable[..., bool]) -> Callable[..., bool]:
    """``Tensor.is_pinned`` that answers True for a CPU tensor whose first byte lies in a live
    hostreg registration (the drop-in's ``cudaHostRegister``, a staging arena, ``pin_``), as
    CUDA's answers for memory ``cudaHostRegister`` registered; torch's own answer otherwise. A
    build of torch without CUDA answers False for all memory it did not allocate pinned
    itself (and, by torch_npu's hooks, likely on Ascend too). About 0.3 us a call more."""

    @functools.wraps(original)
    def is_pinned(self: Any, *args: Any, **kwargs: Any) -> bool:
        return registered_by_hostreg(self) or original(self, *args, **kwargs)

    is_pinned.__hostreg_original__ = original  # type: ignore[attr-defined]
    return is_pinned


def _wrap(original: Callable[[], Any]) -> Callable[[], Any]:
    @functools.wraps(original)
    def cudart() -> Any:
        try:
            runtime = original()
        except AssertionError as e:
            if any(m in str(e) for m in _NO_CUDA):
                return _hostreg_cudart()
            raise
        return _hostreg_cudart() if runtime is None else runtime

    cudart.__hostreg_original__ = original  # type: ignore[attr-defined]
    return cudart


def _cuda_module() -> Any:
    # importlib, not `import torch.cuda`: this also works while torch itself is still being
    # imported (hostreg.auto installs right after torch.cuda is executed).
    return sys.modules.get("torch.cuda") or importlib.import_module("torch.cuda")


def _targets() -> list[Any]:
    """Modules that hold a ``cudart`` name bound to torch's function."""
    mods = [_cuda_module()]
    profiler = sys.modules.get("torch.cuda.profiler")  # binds `from . import cudart`
    if profiler is not None:
        mods.append(profiler)
    return mods


def install() -> None:
    """Route ``torch.cuda.cudart()`` to hostreg wherever torch has no CUDA runtime.

    Idempotent. Imports torch. After it, ``torch.cuda.cudart()`` returns torch's own
    ``torch._C._cudart`` when that works, and :func:`hostreg.cudart` when torch returns
    ``None`` or raises one of the "no CUDA" ``AssertionError``\\ s; other exceptions
    propagate unchanged. On a torch built without CUDA, ``torch.cuda._cudart`` (read by
    ``torch.cuda.check_error``) becomes :func:`hostreg.cudart` as well. ``Tensor.is_pinned()``
    answers True for memory hostreg registered (:func:`_wrap_is_pinned`), as CUDA's answers for
    ``cudaHostRegister``'s; :func:`uninstall` restores torch's own.
    """
    global _original
    if _original is not None:
        return
    cuda = _cuda_module()
    original = cuda.cudart
    wrapper = _wrap(original)
    for mod in _targets():
        if getattr(mod, "cudart", None) is original:
            mod.cudart = wrapper
    if getattr(cuda, "_cudart", False) is None and not _torch_has_cuda():
        cuda._cudart = _hostreg_cudart()  # for torch.cuda.check_error / CudaError
    tensor = importlib.import_module("torch._tensor").Tensor  # also while torch itself is still being imported
    global _original_is_pinned, _is_pinned_wrapper
    _original_is_pinned = tensor.__dict__.get("is_pinned")  # None: inherited from torch._C.TensorBase
    _is_pinned_wrapper = tensor.is_pinned = _wrap_is_pinned(tensor.is_pinned)
    _original = original


def _torch_has_cuda() -> bool:
    """This torch was built with CUDA (``torch._C`` binds the CUDA device calls)."""
    torch_c = sys.modules.get("torch._C")
    return torch_c is not None and hasattr(torch_c, "_cuda_getDeviceCount")


def uninstall() -> None:
    """Restore torch's own ``torch.cuda.cudart``. No-op if not installed.

    Warns if registrations are still live: PyTorch's finalizers unregister them through
    ``torch.cuda.cudart()``, which will fail again once hostreg is gone.
    """
    global _original
    if _original is None:
        return
    for mod in _targets():
        current = getattr(mod, "cudart", None)
        if getattr(current, "__hostreg_original__", None) is _original:
            mod.cudart = _original
    cuda = _cuda_module()
    if getattr(cuda, "_cudart", None) is _hostreg_cudart():
        cuda._cudart = None
    tensor = importlib.import_module("torch._tensor").Tensor  # also while torch itself is still being imported
    if tensor.__dict__.get("is_pinned") is _is_pinned_wrapper:  # not if another wrapper went on top since
        if _original_is_pinned is None:
            del tensor.is_pinned  # torch._C.TensorBase's again
        else:
            tensor.is_pinned = _original_is_pinned
    _original = None
    live = _core.stats().registrations
    if live:
        warnings.warn(
            f"hostreg.torch.uninstall(): {live} registrations are still live; PyTorch's "
            "finalizers will not be able to unregister them through torch.cuda.cudart()",
            RuntimeWarning,
            stacklevel=2,
        )


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _original is not None
