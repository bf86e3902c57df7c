"""DCP storage writer and reader at the disk's own speed (docs/checkpoint.md).

:class:`FileSystemWriter` writes what DCP's own ``FileSystemWriter`` writes, one file per rank
of ``torch.save`` containers (``container.py``) plus ``.metadata``, so the stock
``FileSystemReader``, ``dcp.load`` and ``format_utils.dcp_to_torch_save`` read it; but each
tensor's bytes go from its memory (a hostreg arena, or any CPU tensor) straight to the disk
with ``O_DIRECT``, several large requests in flight, checksummed meanwhile, by the C core
(``hostregFileWrite``, include/hostreg/io.h). :class:`FileSystemReader` reads its own and stock
checkpoints the same way into the destination tensors.

The package in files: ``files.py`` (opening files for O_DIRECT, the transfer statistics),
``parts.py`` (a file laid out in parts, each written by the C core while the next is laid
out), ``container.py`` / ``container_read.py`` (one tensor's ``torch.save`` container), ``writer.py`` (:class:`FileSystemWriter`), ``reader.py`` (:class:`FileSystemReader`);
planning once per structure: ``planner.py`` (:class:`SavePlanner`), ``load_planner.py``
(:class:`LoadPlanner`: whole tensors' read items made directly), ``fixed.py`` (a file's
tensor containers laid out once), ``metadata_file.py`` (``.metadata`` pickled once),
``keyed.py`` (what is made once travels between ranks as a token and its bytes); reading
files it did not write: ``read_chunks.py`` (small containers a chunk at a time),
``metadata_read.py`` (``.metadata`` unpickled as data, its entries checked) and ``verify.py``
(every byte against what was saved: ``verify=True``, ``hostreg verify``).
"""

from __future__ import annotations

from . import fixed as _fixed
from . import keyed as _keyed
from . import metadata_file as _metadata_file
from . import planner as _planner
from .load_planner import LoadPlanner
from .metadata_read import UntrustedMetadataError
from .planner import SavePlanner
from .reader import FileSystemReader
from .verify import CorruptCheckpointError
from .writer import FileSystemWriter


def clear_plan_cache() -> None:
    """Forget every plan, file layout and ``.metadata`` prefix that hostreg's
    :class:`SavePlanner` and :class:`FileSystemWriter` remember in this process (the next save
    of each structure plans and lays out anew; nothing else changes)."""
    _planner.clear_plan_cache()
    _fixed.clear()
    _metadata_file.clear()
    _keyed.clear()


__all__ = [
    "CorruptCheckpointError",
    "FileSystemReader",
    "FileSystemWriter",
    "LoadPlanner",
    "SavePlanner",
    "UntrustedMetadataError",
    "clear_plan_cache",
]
