"""The stage job's checkpoint round trip (``hostreg stage --save``): the staged state dict
saved as a DCP checkpoint by hostreg's writer, loaded back by its reader and compared; and the
state dicts the job reads from files (``--checkpoint``)."""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from .. import torch as hostreg_torch
from .._errors import StagingError
from ..torch import _tree

#: progress(phase, done, total): phase is "create", "copy", "verify", "ceiling", "save" or "load"; done/total in bytes.
Progress = Callable[[str, int, int], None]


class SaveError(StagingError):
    """The staged state dict could not be saved as a checkpoint, loaded back, or verified;
    the message names the directory and the cause (``ENOSPC``, ``EACCES``, a differing
    value)."""


@dataclass
class SaveReport:
    """A staged state dict saved as a DCP checkpoint and loaded back (``hostreg stage --save``)."""

    directory: str  #: where the checkpoint is (left there: stock DCP reads it too)
    tensor_bytes: int  #: bytes of the tensors saved
    file_bytes: int  #: bytes of the checkpoint's files
    save_s: float  #: seconds of dcp.save through hostreg.torch.FileSystemWriter (durable: fdatasync)
    load_s: float  #: seconds of dcp.load through hostreg.torch.FileSystemReader
    direct: bool  #: the files were written and read with O_DIRECT (else through the page cache)
    ceiling: Any  #: hostreg.cli.ceiling.Ceiling of the same directory and bytes

    @property
    def save_bps(self) -> float:
        return self.tensor_bytes / self.save_s if self.save_s > 0 else float("inf")

    @property
    def load_bps(self) -> float:
        return self.tensor_bytes / self.load_s if self.load_s > 0 else float("inf")


def iter_tensors(obj: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """(dotted key, tensor) for every tensor in a nested dict/list/tuple state dict."""
    tensors, _, spec = _tree.flatten(obj)
    for path, t in zip(_tree.tensor_paths(spec), tensors):
        yield _tree.dotted(path), t


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load a state dict from a ``.safetensors`` file or a ``torch.save`` file (``.pt``,
    ``.pth``, ``.bin``; loaded with ``weights_only=True``, so only tensors and plain
    containers, never pickled code such as a whole ``nn.Module``).

    Raises ``StagingError`` naming the file for a missing or unreadable file, an unknown
    suffix, a corrupt file, one that holds no tensors, or a missing ``safetensors`` package.
    """
    p = Path(path)
    if not p.is_file():
        raise StagingError(f"checkpoint {p} does not exist or is not a file")
    if p.suffix not in (".safetensors", ".pt", ".pth", ".bin"):
        raise StagingError(f"checkpoint {p}: unknown format {p.suffix!r} (use .safetensors, .pt, .pth or .bin)")
    if p.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise StagingError("reading .safetensors needs the safetensors package: pip install safetensors") from None
    try:
        if p.suffix == ".safetensors":
            sd: Any = load_file(str(p), device="cpu")
        else:
            sd = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- any reader failure means "cannot read this file"
        hint = (
            " (a whole nn.Module cannot be loaded safely: save its state_dict())"
            if "Unsupported global" in str(e)
            else ""
        )
        raise StagingError(
            f"cannot read checkpoint {p}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}{hint}"
        ) from e
    if not isinstance(sd, dict) or not any(True for _ in iter_tensors(sd)):
        raise StagingError(f"checkpoint {p} holds no state dict of tensors")
    return sd


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes (so NaNs compare equal, unlike ``torch.equal``)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.numel() == 0:
        return True
    a, b = a.resolve_conj().resolve_neg(), b.resolve_conj().resolve_neg()
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def _cause(e: BaseException) -> BaseException:
    """What went wrong: for DCP's CheckpointException, the first rank's own exception (its
    ``failures`` map ranks to ``(exception, traceback summary)`` in torch 2.13's
    torch/distributed/checkpoint/utils.py, to the exception alone in older ones)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        if isinstance(inner, tuple) and inner and isinstance(inner[0], BaseException):
            return inner[0]
        if isinstance(inner, BaseException):
            return inner
    return e


def _why(e: BaseException) -> str:
    """The first line of what went wrong, with its exception's name."""
    e = _cause(e)
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


def _reraise_interrupt(e: BaseException) -> None:
    """An interrupt (Ctrl-C) stays an interrupt, also when DCP wrapped it."""
    if isinstance(_cause(e), (KeyboardInterrupt, SystemExit)):
        raise KeyboardInterrupt from None


def save_and_load(
    source: dict[str, Any], staged: dict[str, Any], directory: str | Path, progress: Progress
) -> SaveReport:
    """Saves ``staged`` as a DCP checkpoint in ``directory`` (made if missing; a checkpoint
    there is replaced) with :class:`hostreg.torch.FileSystemWriter`, loads it back with
    :class:`hostreg.torch.FileSystemReader` into fresh tensors whose every byte differed from
    the source before, and compares every byte with ``source``. Measures the filesystem's own
    ceiling for the same bytes first (``hostreg.cli.ceiling``). Raises :class:`SaveError`."""
    import warnings

    import torch.distributed.checkpoint as dcp

    from . import ceiling as ceiling_of

    d = os.fspath(directory)
    total = sum(t.numel() * t.element_size() for _, t in iter_tensors(source))
    try:
        os.makedirs(d, exist_ok=True)
        fs = os.statvfs(d)
    except OSError as e:
        raise SaveError(f"cannot use {d} for the checkpoint: {_why(e)}") from e
    free = fs.f_bavail * fs.f_frsize
    if fs.f_blocks and free < total + (1 << 20):  # 0 blocks: no size limit (ramfs)
        raise SaveError(f"{d} has {free:,} bytes free; the checkpoint needs about {total:,} (its tensors' bytes)")
    try:
        progress("ceiling", 0, total)
        ceiling = ceiling_of.measure(d, max(total, 1 << 20))
        progress("ceiling", total, total)
    except (OSError, RuntimeError) as e:
        raise SaveError(f"cannot measure the disk's ceiling in {d}: {_why(e)}") from e
    writer = hostreg_torch.FileSystemWriter(d)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        progress("save", 0, total)
        t0 = time.perf_counter()
        try:
            dcp.save(staged, storage_writer=writer)
        except BaseException as e:  # DCP raises CheckpointException, a BaseException
            _reraise_interrupt(e)
            raise SaveError(f"cannot save the checkpoint to {d}: {_why(e)}") from None
        save_s = time.perf_counter() - t0
        progress("save", total, total)
        back = _inverted_copy(source)
        reader = hostreg_torch.FileSystemReader(d)
        progress("load", 0, total)
        t0 = time.perf_counter()
        try:
            dcp.load(back, storage_reader=reader)
        except BaseException as e:
            _reraise_interrupt(e)
            raise SaveError(f"cannot load the checkpoint back from {d}: {_why(e)}") from None
        load_s = time.perf_counter() - t0
        progress("load", total, total)
    src = dict(iter_tensors(source))
    bad = [k for k, t in iter_tensors(back) if not same_bytes(src[k], t)]
    if bad:
        raise SaveError(f"the checkpoint in {d} loaded back with other values: {', '.join(bad[:10])}")
    mine = {".metadata", *(info.relative_path for info in reader.storage_data.values())}  # not other files in d
    files = sum(os.path.getsize(os.path.join(d, f)) for f in mine if os.path.isfile(os.path.join(d, f)))
    return SaveReport(d, total, files, save_s, load_s, writer.stats.direct and reader.stats.direct, ceiling)


def _inverted(t: torch.Tensor) -> torch.Tensor:
    """A fresh tensor like ``t`` whose every byte differs from ``t``'s (each one inverted)."""
    out = t.detach().clone(memory_format=torch.contiguous_format)
    if out.numel():
        out.view(-1).view(torch.uint8).bitwise_not_()
    return out


def _inverted_copy(obj: Any) -> Any:
    """``obj`` with every tensor replaced by :func:`_inverted` of it (other values copied)."""
    tensors, values, spec = _tree.flatten(obj)
    return _tree.unflatten(spec, [_inverted(t) for t in tensors], copy.deepcopy(values))
