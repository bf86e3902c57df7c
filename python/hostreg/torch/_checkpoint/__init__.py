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
out), ``container.py`` / ``container_read.py`` (one tensor's ``torch.save`` container), ``writer.py`` (:class:`FileSystemWriter`), ``reader.py`` (:class:`FileSystemReader`).
"""

from __future__ import annotations

from .reader import FileSystemReader
from .writer import FileSystemWriter

__all__ = ["FileSystemReader", "FileSystemWriter"]
