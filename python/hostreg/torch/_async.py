"""What an async :class:`~hostreg.torch.Stager` needs around its staging thread: whether
torch's ``dcp.async_save`` takes a staging future, whether an accelerator is there, and the
completion a staging future leaves for ``synchronize_staging()``."""

from __future__ import annotations

from concurrent.futures import Future

import torch


def settle(done: Future, f: Future) -> None:
    """Completes ``done`` as staging future ``f`` ended: a cancelled stage (never staged)
    cancels it, so that synchronize_staging() raises CancelledError as DCP's DefaultStager's
    does (``Future.exception()`` would raise inside this callback and leave ``done`` pending)."""
    if f.cancelled():
        done.cancel()
        return
    err = f.exception()
    if err is not None:
        done.set_exception(err)
    else:
        done.set_result(None)


def accelerator_available() -> bool:
    acc = getattr(torch, "accelerator", None)  # torch >= 2.6
    return bool(acc is not None and acc.is_available())


def async_save_takes_futures() -> bool:
    """torch's ``dcp.async_save`` accepts a stager whose ``stage()`` returns a Future (it came
    with ``AsyncSaveResponse``, torch 2.7)."""
    try:
        from torch.distributed.checkpoint import state_dict_saver
    except ImportError:
        return False
    return hasattr(state_dict_saver, "AsyncSaveResponse")
