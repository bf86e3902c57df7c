"""The reader's rows: whole plain tensors of an index (``index.py``), read and copied in arrays
(docs/checkpoint.md, "Reading").

hostreg's ``LoadPlanner`` plans a plain tensor that the checkpoint stores whole as a row of the
index (``load_planner.RowItems``). :func:`serve_rows` reads those containers (up to ``WHOLE``
bytes each) a chunk at a time, as the reader's other small containers are read
(``read_chunks.pipelined``), checks each one against the layout hostreg's writer gives a tensor
of its destination's dtype and shape (``container_read.data_offset``), and copies the tensors'
bytes into their destinations with one ``hostregCopyBatch`` a chunk. The rows' byte ranges,
the chunks' segments and the checks are tensors over all rows, and the containers of one
pattern in a chunk are compared with the first of them in one comparison, so Python's work per
row is a few lookups made at C speed (``map``): about a microsecond, where making and serving a
``ReadItem`` took about 15.

What this does not serve is returned, to be read as ``ReadItem`` s: destinations that are not
contiguous CPU tensors, containers over ``WHOLE`` bytes (read straight into their destination
instead) and containers not laid out as hostreg's writer lays them out (another writer's, or
another dtype than the destination's: parsed, converted).
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
from collections.abc import Callable
from itertools import repeat
from typing import Any

import torch

from .._copy import copy_batch
from .._layout import bool_tensor, dtype_of, int64_tensor, is_cpu
from . import read_chunks as _chunks
from .container_read import Pattern, data_offset, pattern
from .metadata_read import check_spans

GROUP = 8  # containers of one pattern in a chunk compared at once from this many on


def serve_rows(
    index: Any,
    rows: list[int],
    state_dict: dict[str, Any],
    directory: str,
    opened: Callable[[str], Any],
    transfer: Callable[[int, torch.Tensor], None],
    commit: Callable[[int, torch.Tensor], None] | None,
    whole: int,
    others: dict[str, tuple[list[int], list[int], list[str]]],
) -> list[int]:
    """Reads and copies the ``rows`` of ``index`` (row numbers of tensors stored whole) into
    their destinations, ``state_dict[name]`` (the planner's flattened state dict: a plain
    tensor of the stored size, as the planner found). ``opened(path)``: a context manager
    giving a file descriptor to read the file at ``path``; ``transfer(fd, segments)``: reads the
    segments (an int64 tensor of shape (k, 3): file offset, bytes, address); ``commit(row,
    tensor)``: called for each row served, where the planner wants to be told. Containers of
    more than ``whole`` bytes are left. Returns the rows it did not serve.

    Before a file is read, every row in it and the load's other items in it (``others``: file
    name -> their containers' offsets, lengths and names) are checked together: ``ValueError``
    naming the tensor where one runs past the file's end or overlaps another
    (``metadata_read.check_spans``)."""
    if not rows:
        return []
    first_chunk, file_col, offset_col, length_col = index.columns()
    r = int64_tensor(rows)
    chunk = first_chunk[r]
    offs, lens = offset_col[chunk], length_col[chunk]
    canon: dict[str, int] = {}  # one number per file name (the index may list a name twice)
    files = int64_tensor([canon.setdefault(name, len(canon)) for name in index.files])[file_col[chunk]]
    paths = list(canon)
    names = index.names
    ts = list(map(state_dict.__getitem__, map(names.__getitem__, rows)))
    plain = torch.Tensor
    stored = map(index.dtypes.__getitem__, map(index.dtype.__getitem__, rows))
    direct = bool_tensor(map(operator.is_, map(dtype_of, ts), stored))  # else converted: left
    direct &= bool_tensor(map(is_cpu, ts)) & bool_tensor(map(plain.is_contiguous, ts))
    direct &= ~(bool_tensor(map(plain.is_conj, ts)) | bool_tensor(map(plain.is_neg, ts)))
    pats: list[Pattern | None] = []
    pid_of: dict[tuple, int] = {}
    pids: list[int] = []
    for key in zip(map(dtype_of, ts), map(plain.size, ts)):
        p = pid_of.get(key)
        if p is None:
            p = pid_of[key] = len(pats)
            pats.append(pattern(*key))
        pids.append(p)
    pid = int64_tensor(pids)
    nbytes = int64_tensor([0 if p is None else p.nbytes for p in pats])  # per pattern
    direct &= bool_tensor([p is not None for p in pats])[pid] & (lens > 0) & (lens <= whole)
    order = offs.argsort(stable=True)
    order = order[files[order].argsort(stable=True)]  # by file, then offset
    ptrs = int64_tensor(list(map(plain.data_ptr, ts)))
    served = torch.zeros(len(rows), dtype=torch.bool)
    ids, counts = torch.unique_consecutive(files[order], return_counts=True)
    at = 0
    for f, count in zip(ids.tolist(), counts.tolist()):
        here = order[at : at + count]
        at += count
        path = paths[f]
        o, n, labels = others.get(path, ([], [], []))
        with opened(os.path.join(directory, path)) as fd:
            check_spans(
                path,
                os.fstat(fd).st_size,
                torch.cat((offs[here], int64_tensor(o))),
                torch.cat((lens[here], int64_tensor(n))),
                functools.partial(_name, names, rows, here, labels),
            )
            mine = here[direct[here]]
            if len(mine):
                _serve_file(fd, mine, offs, lens, pid, pats, nbytes, ptrs, served, transfer)
    if commit is not None:
        for i in served.nonzero().squeeze(1).tolist():
            commit(rows[i], ts[i])
    return [rows[i] for i in (~served).nonzero().squeeze(1).tolist()]


def _name(names: list[str], rows: list[int], here: torch.Tensor, labels: list[str], j: int) -> str:
    """The name of the j-th container checked: a row's tensor, then the other items."""
    return names[rows[int(here[j])]] if j < len(here) else labels[j - len(here)]


def _serve_file(
    fd: int,
    mine: torch.Tensor,
    offs: torch.Tensor,
    lens: torch.Tensor,
    pid: torch.Tensor,
    pats: list[Pattern | None],
    nbytes: torch.Tensor,
    ptrs: torch.Tensor,
    served: torch.Tensor,
    transfer: Callable[[int, torch.Tensor], None],
) -> None:
    """Serves the rows ``mine`` (positions into the other tensors, in file order) of one file,
    marking in ``served`` those copied (``nbytes``: each pattern's data bytes)."""
    o, n = offs[mine], lens[mine]
    pieces = _chunks.cut(n.tolist())
    ends = n.cumsum(0)
    starts = ends - n
    pos = starts.clone()  # each container's offset in its chunk's buffer
    for a, b, _ in pieces:
        pos[a:b] -= starts[a]

    def fill(k: int, buf: Any, base: int) -> None:
        a, b, _ = pieces[k]
        transfer(fd, torch.stack((o[a:b], n[a:b], pos[a:b] + base), 1))

    reads = _chunks.pipelined([size for _, _, size in pieces], fill)
    with contextlib.closing(reads):
        for k, (buf, base, _) in enumerate(reads):
            a, b, _ = pieces[k]
            rows = mine[a:b]
            got, src = _check_chunk(buf, pos[a:b], n[a:b], pid[rows], pats)
            if len(got):
                done = rows[got]
                copy_batch(ptrs[done].tolist(), (src + base).tolist(), nbytes[pid[done]].tolist(), 0)
                served[done] = True


def _check_chunk(
    buf: Any, pos: torch.Tensor, n: torch.Tensor, pid: torch.Tensor, pats: list[Pattern | None]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Of the containers at ``pos`` (``n`` bytes each) in ``buf``, those laid out as hostreg's
    writer lays out a tensor of pattern ``pats[pid]`` (what ``data_offset`` checks of each):
    (their places in ``pos``, their data's offsets in ``buf``)."""
    order = pid.argsort(stable=True)
    ids, counts = torch.unique_consecutive(pid[order], return_counts=True)
    data = torch.full_like(pos, -1)
    whole = None
    one_by_one: list[tuple[int, Pattern]] = []
    at = 0
    for p, count in zip(ids.tolist(), counts.tolist()):
        pat = pats[p]
        assert pat is not None  # rows without a pattern are never read here
        members = order[at : at + count]
        at += count
        if count >= GROUP:
            if whole is None:
                whole = torch.frombuffer(buf, dtype=torch.uint8)
            members = _compare(whole, buf, members, pos, n, pat, data)
        one_by_one += zip(members.tolist(), repeat(pat))
    if one_by_one:
        pos_l, n_l = pos.tolist(), n.tolist()
        js, found = [], []
        for j, pat in one_by_one:
            rel = data_offset(buf, pos_l[j], n_l[j], pat)
            if rel >= 0:
                js.append(j)
                found.append(pos_l[j] + rel)
        data[int64_tensor(js)] = int64_tensor(found)
    got = (data >= 0).nonzero().squeeze(1)
    return got, data[got]


def _compare(
    whole: torch.Tensor,
    buf: Any,
    members: torch.Tensor,
    pos: torch.Tensor,
    n: torch.Tensor,
    pat: Pattern,
    data: torch.Tensor,
) -> torch.Tensor:
    """Checks the containers ``members`` of one pattern at once against the first of them, once
    ``data_offset`` found that one good: the same length, the same bytes up to the data
    (records before it, the data record's local header and its padding, which carries no CRC:
    bit 3 puts CRC and sizes after the data), and after the data a descriptor with the same
    signature and sizes (its CRC differs from tensor to tensor). Sets ``data`` (the data's
    offset in the buffer) of those that match; returns the members left to check one by one."""
    p0, n0 = int(pos[members[0]]), int(n[members[0]])
    rel = data_offset(buf, p0, n0, pat)
    if rel < 0:
        return members
    at = pos[members]
    same = n[members] == n0
    head = whole.unfold(0, rel, 1)[at[same]]  # (k, rel) bytes, gathered
    if rel % 8 == 0:
        head = head.view(torch.int64)  # the same comparison in an eighth of the steps
    size = pat.desc.size
    desc = whole.unfold(0, size, 1)[at[same] + rel + pat.nbytes]
    good = (head == head[0]).all(1)
    good &= (desc[:, :4] == desc[0, :4]).all(1) & (desc[:, 8:] == desc[0, 8:]).all(1)
    matched = same.clone()
    matched[same] = good
    data[members[matched]] = at[matched] + rel
    return members[~matched]
