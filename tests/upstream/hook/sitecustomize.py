"""Puts hostreg's DCP classes where PyTorch's own DCP tests look for DCP's, in every Python
process the tests start (``scripts/upstream-dcp`` puts this folder on ``PYTHONPATH``; a
``spawn``ed rank runs it too), and logs which classes did the I/O.

``HOSTREG_DCP_SWAP``: a comma-separated subset of ``writer``, ``reader``, ``planners``; empty or
unset: nothing is swapped (the stock run), the I/O is still logged.
``HOSTREG_DCP_SWAP_LOG``: a folder; each process appends ``<test id>\\t<what>`` lines to
``<pid>.log`` there, one a call, where ``<what>`` is one of

- ``hostreg-writer``: hostreg's writer wrote the save itself;
- ``hostreg-writer-stock``: hostreg's writer handed the save to DCP's code (``_extensions``);
- ``hostreg-reader``: hostreg's reader read a load (what it cannot read itself, items with
  stream transforms, it hands on to DCP's code);
- ``hostreg-reader-file``: hostreg's reader opened one file to read it itself (its read items
  or the rows of hostreg's index);
- ``dcp-writer`` / ``dcp-reader``: DCP's ``FileSystemWriter.write_data`` /
  ``FileSystemReader.read_data`` ran on DCP's class or a test's own subclass of it (not where
  hostreg's classes hand work on to them: see below);
- ``dcp-save-planner`` / ``dcp-load-planner``: DCP's ``DefaultSavePlanner`` /
  ``DefaultLoadPlanner`` (the class itself, not a subclass) made a local plan;
- ``hostreg-save-planner`` / ``hostreg-load-planner``: hostreg's planner made a local plan.

The test id is pytest's ``PYTEST_CURRENT_TEST`` (inherited by the ranks a test starts) without
its phase.

The names replaced are the ones DCP's code and the tests import: ``FileSystemWriter`` and
``FileSystemReader`` in ``torch.distributed.checkpoint``, ``.filesystem`` and
``._storage_utils`` (which builds them for ``checkpoint_id=``), ``DefaultSavePlanner`` and
``DefaultLoadPlanner`` in ``torch.distributed.checkpoint``, ``.default_planner`` and the
modules of ``dcp.save`` / ``dcp.load`` (their defaults). torch's own subclasses of DCP's
classes (``FsspecWriter``, the Hugging Face ones, format_utils' planner) stay subclasses of
DCP's: their modules are imported before the swap, and their work is not logged as DCP's.

DCP's labels are not logged while hostreg's class is running (hostreg's writer and reader hand
some work to DCP's code on purpose: ``hostreg-writer-stock``, items with stream transforms), so
a DCP label in a swapped run means DCP's class was used instead of hostreg's.

Each process writes ``<pid>.hook`` in the log folder: ``ok`` once the swap is in place, or the
error that stopped it (Python only warns when ``sitecustomize`` fails, and runs on).
"""

import os
import threading
import traceback

_inside = threading.local()  # depth of hostreg's logged methods running on this thread


def _log(what: str) -> None:
    folder = os.environ.get("HOSTREG_DCP_SWAP_LOG")
    if not folder:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    with open(os.path.join(folder, f"{os.getpid()}.log"), "a") as f:
        f.write(f"{test}\t{what}\n")


def _wrap(cls: type, name: str, what) -> None:  # type: ignore[no-untyped-def]
    original = getattr(cls, name)

    def logged(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        label = what(self) if callable(what) else what
        ours = bool(label) and label.startswith("hostreg-")
        if label and (ours or not getattr(_inside, "depth", 0)):
            _log(label)
        if not ours:
            return original(self, *args, **kwargs)
        _inside.depth = getattr(_inside, "depth", 0) + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            _inside.depth -= 1

    logged.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(cls, name, logged)


def _install() -> None:
    wanted = {w for w in os.environ.get("HOSTREG_DCP_SWAP", "").split(",") if w}
    unknown = wanted - {"writer", "reader", "planners"}
    if unknown:
        raise SystemExit(f"HOSTREG_DCP_SWAP: unknown part(s) {sorted(unknown)}")
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint._storage_utils as storage_utils
    import torch.distributed.checkpoint.default_planner as default_planner
    import torch.distributed.checkpoint.filesystem as filesystem
    import torch.distributed.checkpoint.state_dict_loader as loader
    import torch.distributed.checkpoint.state_dict_saver as saver

    import hostreg.torch as ht
    from hostreg.torch._checkpoint import reader as hr_reader
    from hostreg.torch._checkpoint import writer as hr_writer

    for subclasses in ("_fsspec_filesystem", "hf_storage"):  # defined on DCP's classes, as in a user's process
        try:
            __import__(f"torch.distributed.checkpoint.{subclasses}")
        except ImportError:  # fsspec (or what the module needs) is not installed: its tests skip
            pass

    originals = (filesystem.FileSystemWriter, filesystem.FileSystemReader)  # before the swap

    def dcp_class(label: str):  # type: ignore[no-untyped-def]
        """``label`` for DCP's class itself or a test's own subclass of it; None for torch's
        own subclasses (never swapped)."""

        def which(obj) -> "str | None":  # type: ignore[no-untyped-def]
            cls = type(obj)
            if cls in originals:
                return label
            return None if cls.__module__.startswith("torch.") else label

        return which

    _wrap(filesystem.FileSystemWriter, "write_data", dcp_class("dcp-writer"))
    _wrap(filesystem.FileSystemReader, "read_data", dcp_class("dcp-reader"))
    _wrap(hr_writer.FileSystemWriter, "write_data", lambda w: "hostreg-writer-stock" if w.stock else "hostreg-writer")
    _wrap(hr_reader.FileSystemReader, "read_data", "hostreg-reader")
    _wrap(hr_reader.FileSystemReader, "_opened", "hostreg-reader-file")
    # DCP's planners only where the planner is DCP's default class itself (torch's own
    # subclasses of it, such as format_utils' DynamicMetaLoadPlanner, are never swapped).
    save, load = default_planner.DefaultSavePlanner, default_planner.DefaultLoadPlanner
    _wrap(save, "create_local_plan", lambda p: "dcp-save-planner" if type(p) is save else None)
    _wrap(load, "create_local_plan", lambda p: "dcp-load-planner" if type(p) is load else None)
    _wrap(ht.SavePlanner, "create_local_plan", "hostreg-save-planner")
    _wrap(ht.LoadPlanner, "create_local_plan", "hostreg-load-planner")

    if "writer" in wanted:
        for m in (dcp, filesystem, storage_utils):
            m.FileSystemWriter = ht.FileSystemWriter  # type: ignore[attr-defined]
    if "reader" in wanted:
        for m in (dcp, filesystem, storage_utils):
            m.FileSystemReader = ht.FileSystemReader  # type: ignore[attr-defined]
    if "planners" in wanted:
        for m in (dcp, default_planner, saver):
            m.DefaultSavePlanner = ht.SavePlanner  # type: ignore[attr-defined]
        for m in (dcp, default_planner, loader):
            m.DefaultLoadPlanner = ht.LoadPlanner  # type: ignore[attr-defined]


def _main() -> None:
    marker = os.path.join(os.environ["HOSTREG_DCP_SWAP_LOG"], f"{os.getpid()}.hook")
    try:
        _install()
    except BaseException:
        with open(marker, "w") as f:
            f.write("error: " + traceback.format_exc())
        raise
    with open(marker, "w") as f:
        f.write("ok\n")


if os.environ.get("HOSTREG_DCP_SWAP_LOG") is not None:
    _main()
