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
- ``hostreg-reader-file``: hostreg's reader read one file itself;
- ``dcp-writer`` / ``dcp-reader``: DCP's ``FileSystemWriter.write_data`` /
  ``FileSystemReader.read_data`` ran (also where hostreg's classes hand items on to them);
- ``dcp-save-planner`` / ``dcp-load-planner``: DCP's ``DefaultSavePlanner`` /
  ``DefaultLoadPlanner`` (the class itself, not a subclass) made a local plan;
- ``hostreg-save-planner`` / ``hostreg-load-planner``: hostreg's planner made a local plan.

The test id is pytest's ``PYTEST_CURRENT_TEST`` (inherited by the ranks a test starts) without
its phase.

The names replaced are the ones DCP's code and the tests import: ``FileSystemWriter`` and
``FileSystemReader`` in ``torch.distributed.checkpoint``, ``.filesystem`` and
``._storage_utils`` (which builds them for ``checkpoint_id=``), ``DefaultSavePlanner`` and
``DefaultLoadPlanner`` in ``torch.distributed.checkpoint``, ``.default_planner`` and the
modules of ``dcp.save`` / ``dcp.load`` (their defaults). Classes already defined as subclasses
of DCP's (in torch's own modules) stay what they are.
"""

import os


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
        if label:
            _log(label)
        return original(self, *args, **kwargs)

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

    _wrap(filesystem.FileSystemWriter, "write_data", "dcp-writer")
    _wrap(filesystem.FileSystemReader, "read_data", "dcp-reader")
    _wrap(hr_writer.FileSystemWriter, "write_data", lambda w: "hostreg-writer-stock" if w.stock else "hostreg-writer")
    _wrap(hr_reader.FileSystemReader, "read_data", "hostreg-reader")
    _wrap(hr_reader.FileSystemReader, "_read_file", "hostreg-reader-file")
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


if os.environ.get("HOSTREG_DCP_SWAP_LOG") is not None:
    _install()
