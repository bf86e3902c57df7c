"""Fast staging: hostreg.torch.create_cpu_state_dict / copy_state_dict put a whole state dict
in one shared arena, registered once (python/hostreg/torch/_state_dict.py).

Compared with PyTorch's own _create_cpu_state_dict / _check_state_dict_similarity /
_copy_state_dict; registration and locking checked with hostreg's registry and the kernel's
VmLck. Failure paths (RLIMIT_MEMLOCK, a 64 MiB /dev/shm) run in child processes."""

from __future__ import annotations

import gc
import io
import json
import os
import subprocess
import sys
import textwrap
from collections import OrderedDict

import pytest
import torch
import torch.multiprocessing as mp
from conftest import low_memlock, run_python
from torch.distributed._state_dict_utils import (
    _check_state_dict_similarity,
    _copy_state_dict,
    _create_cpu_state_dict,
)

import hostreg
import hostreg.torch as ht

pytestmark = pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state:UserWarning")

ALIGN = ht.ALIGNMENT
MiB = 1 << 20


# ---- helpers ---------------------------------------------------------------------------


def tensors_of(obj) -> list[torch.Tensor]:
    """Tensors of a nested dict/list/tuple in traversal (insertion) order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_of(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_of(v)]
    return []


def structure(obj):
    """Comparable description: containers, keys (in order), tensor shapes/dtypes, other values."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return ("dict", [(k, structure(v)) for k, v in obj.items()])
    if isinstance(obj, list):
        return ("list", [structure(v) for v in obj])
    if isinstance(obj, tuple):
        return ("tuple", [structure(v) for v in obj])
    if isinstance(obj, io.BytesIO):
        return ("BytesIO", obj.getvalue())
    return (type(obj).__name__, obj)


def raw(t: torch.Tensor) -> torch.Tensor:
    """The logical values of t as bytes (works for every dtype, NaN, conj/neg views, 0-d)."""
    return t.resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(raw(a), raw(b))


def expected_offsets(tensors: list[torch.Tensor]) -> list[int]:
    """The documented layout: traversal order, each tensor at the next multiple of ALIGNMENT."""
    out, off = [], 0
    for t in tensors:
        off = -(-off // ALIGN) * ALIGN
        out.append(off)
        off += t.numel() * t.element_size()
    return out


def staging_buffer_of(t: torch.Tensor):
    """The hostreg arena (its StagingBuffer) tensor t lives in, or None."""
    from hostreg.torch import _sharing

    return _sharing.staging_buffer_of(t)


def in_shared_arena(t: torch.Tensor) -> bool:
    buf = staging_buffer_of(t)
    return buf is not None and buf.fd >= 0


def check_one_arena(src_tensors: list[torch.Tensor], staged_tensors: list[torch.Tensor], *, registered: bool) -> None:
    """Every staged tensor has a storage of its own holding exactly its bytes, inside one arena
    at the documented offset; no two overlap; (registered) one live registration covers all."""
    assert len(src_tensors) == len(staged_tensors)
    for s, d in zip(src_tensors, staged_tensors):
        assert d.device.type == "cpu" and d.dtype == s.dtype and d.shape == s.shape
        if s.is_contiguous() and s.untyped_storage().nbytes() == s.nbytes:  # a tensor owning its storage
            assert d.is_contiguous() and d.storage_offset() == 0
            assert d.untyped_storage().nbytes() == d.nbytes, "a staged tensor's storage must hold exactly its bytes"
    nonempty = [
        (s, d, off) for s, d, off in zip(src_tensors, staged_tensors, expected_offsets(src_tensors)) if d.nbytes
    ]
    if any(s.untyped_storage().nbytes() != s.nbytes or not s.is_contiguous() for s, _, _ in nonempty):
        return  # views of shared or larger storages: see test_views_and_tied_weights_are_staged_once
    if not nonempty:
        return
    buf = staging_buffer_of(nonempty[0][1])
    assert buf is not None, "not inside a hostreg arena"
    base = buf.data_ptr
    assert base % ALIGN == 0
    reg = hostreg.registration(base)
    assert (reg is not None) == registered
    for _s, d, off in nonempty:
        assert staging_buffer_of(d) is buf, "not in the one arena"
        assert d.data_ptr() == base + off and (base + off) % ALIGN == 0
        assert off + d.nbytes <= buf.size
        if registered:
            r = hostreg.registration(d.data_ptr())
            assert r == reg, "a tensor lies outside the arena's registration"
            assert reg.base <= d.data_ptr() and d.data_ptr() + d.nbytes <= reg.base + reg.nbytes
    spans = sorted((d.data_ptr(), d.data_ptr() + d.nbytes) for _, d, _ in nonempty)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), "staged tensors overlap"


def rich_state_dict() -> dict:
    saved = io.BytesIO()
    torch.save(torch.arange(4.0), saved)
    saved.seek(0)
    return {
        "weight": torch.randn(8, 4),
        "opt": OrderedDict([("exp_avg", torch.arange(6, dtype=torch.int64)), ("step", torch.tensor(3))]),
        "list": [1, 2.5, "three", b"four", torch.ones(2, 3, dtype=torch.float16), None],
        "tuple": (torch.zeros(0, 3), {"deep": torch.randn(5, dtype=torch.float64)}, 7),
        "buffer": saved,
        "raw": saved.getvalue(),
        "lr": 0.1,
        "name": "model",
    }


def random_like(shape, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype)
    if dtype.is_floating_point:
        return (torch.randn(shape) * 4).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -(1 << 31)), min(info.max, (1 << 31) - 1), shape, dtype=dtype)


ALL_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
] + [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]


@pytest.fixture
def baseline():
    gc.collect()
    return hostreg.stats().registrations, hostreg.locked_bytes()


def released(baseline) -> bool:
    gc.collect()
    return (hostreg.stats().registrations, hostreg.locked_bytes()) == baseline


# ---- structure and PyTorch compatibility -----------------------------------------------


def test_same_structure_and_values_as_torch():
    src = rich_state_dict()
    ref = _create_cpu_state_dict(src)  # torch's: plain CPU tensors, no cudart needed
    staged = ht.create_cpu_state_dict(src, pin_memory=True, share_memory=True)

    assert structure(staged) == structure(ref) == structure(src)
    # Non-tensor values are copies, not the caller's objects; dict subclasses keep their type.
    assert staged["buffer"] is not src["buffer"] and staged["buffer"].getvalue() == src["raw"]
    assert staged["list"][:4] == [1, 2.5, "three", b"four"] and staged["list"][5] is None
    assert staged["tuple"][2] == 7 and staged["lr"] == 0.1 and staged["name"] == "model"
    assert isinstance(staged["opt"], OrderedDict) and isinstance(staged["tuple"], tuple)

    assert _check_state_dict_similarity(src, staged)
    assert _check_state_dict_similarity(staged, src)
    assert not _check_state_dict_similarity(dict(src, weight=torch.randn(8, 5)), staged)
    assert not _check_state_dict_similarity(dict(src, weight=torch.randn(8, 4, dtype=torch.float64)), staged)
    del staged, ref


@pytest.mark.parametrize("copier", ["hostreg", "torch"])
def test_copy_values(copier: str):
    src = rich_state_dict()
    staged = ht.create_cpu_state_dict(src)
    if copier == "hostreg":
        assert ht.copy_state_dict(src, staged) is staged
    else:
        _copy_state_dict(src, staged)
    for s, d in zip(tensors_of(src), tensors_of(staged)):
        assert same_values(s, d)
    assert torch.equal(torch.load(io.BytesIO(staged["buffer"].getvalue()), weights_only=True), torch.arange(4.0))
    # The staged copy is independent of the source.
    src["weight"].add_(1)
    assert not torch.equal(staged["weight"], src["weight"])


# ---- one arena, one registration, really locked ----------------------------------------


def test_one_shared_registered_arena(baseline):
    src = rich_state_dict()
    src["big"] = torch.randn(3, 100_003)  # odd byte counts, several pages
    src["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    regs0, locked0 = baseline

    staged = ht.create_cpu_state_dict(src, pin_memory=True, share_memory=True)
    s_list, d_list = tensors_of(src), tensors_of(staged)
    total = sum(t.nbytes for t in s_list)

    assert hostreg.stats().registrations == regs0 + 1
    check_one_arena(s_list, d_list, registered=True)
    assert all(in_shared_arena(d) for d in d_list if d.nbytes)
    assert all(d.data_ptr() % ALIGN == 0 for d in d_list if d.nbytes)
    assert hostreg.locked_bytes() - locked0 >= total
    # 0-d tensors are placed in the arena and registered (PyTorch's path leaves them unpinned).
    for d in (staged["opt"]["step"], staged["scalar"]):
        assert d.dim() == 0 and hostreg.registration(d.data_ptr()) is not None

    ht.copy_state_dict(src, staged)
    assert all(same_values(s, d) for s, d in zip(s_list, d_list))

    del staged, d_list, d
    assert released(baseline), "registration or lock outlived the staged state dict"


def test_registration_lives_while_any_view_lives(baseline):
    staged = ht.create_cpu_state_dict({"a": torch.ones(1000), "b": torch.ones(10)})
    keep = staged["b"]
    del staged
    gc.collect()
    r = hostreg.registration(keep.data_ptr())
    assert r is not None and hostreg.stats().registrations == baseline[0] + 1
    keep.fill_(3.0)  # still valid memory
    assert torch.equal(keep, torch.full((10,), 3.0))
    del keep
    assert released(baseline)


def test_all_dtypes_0d_and_empty(baseline):
    src = {}
    for dt in ALL_DTYPES:
        name = str(dt).removeprefix("torch.")
        src[name] = random_like((7, 3), dt)
        src[f"{name}.0d"] = random_like((), dt)
        src[f"{name}.odd"] = random_like((5,), dt)
        src[f"{name}.empty"] = torch.empty((0, 3), dtype=dt)
    staged = ht.create_cpu_state_dict(src)
    assert hostreg.stats().registrations == baseline[0] + 1
    check_one_arena(list(src.values()), list(staged.values()), registered=True)
    for k in src:
        if k.endswith(".empty"):
            assert staged[k].shape == (0, 3) and staged[k].numel() == 0
        if k.endswith(".0d"):
            assert staged[k].dim() == 0 and hostreg.registration(staged[k].data_ptr()) is not None
    ht.copy_state_dict(src, staged)
    for k in src:
        assert same_values(src[k], staged[k]), k
    del staged
    assert released(baseline)


def test_empty_only_state_dict(baseline):
    src = {"e": torch.empty(0, 3), "f": torch.empty(0, dtype=torch.int64), "n": 1}
    staged = ht.create_cpu_state_dict(src)
    assert [tuple(t.shape) for t in tensors_of(staged)] == [(0, 3), (0,)] and staged["n"] == 1
    assert ht.copy_state_dict(src, staged) is staged
    del staged
    assert released(baseline)


def noncontiguous_sources() -> dict:
    c = torch.randn(6, 5, dtype=torch.complex64)
    return {
        "transposed": torch.randn(5, 7).t(),
        "stepped": torch.arange(80.0).view(8, 10)[::2, 1::3],
        "expanded": torch.randn(3, 1).expand(3, 4),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "int_stepped": torch.arange(100, dtype=torch.int16)[::7],
        "conj": c.conj(),
        "neg": c._neg_view(),
        "bf16_t": torch.randn(4, 9).to(torch.bfloat16).t(),
    }


@pytest.mark.parametrize("copier", ["hostreg", "torch"])
def test_noncontiguous_sources(copier: str, baseline):
    # Views keep the source's view relations (strides, an expanded tensor's stride 0) over the
    # bytes they touch; conjugate and negative views become contiguous tensors of their values.
    src = noncontiguous_sources()
    staged = ht.create_cpu_state_dict(src)
    assert hostreg.stats().registrations == baseline[0] + 1
    (ht.copy_state_dict if copier == "hostreg" else _copy_state_dict)(src, staged)
    for k in src:
        d = staged[k]
        assert not d.is_conj() and not d.is_neg(), k
        if k in ("conj", "neg", "expanded"):  # values resolved; writable by copy_
            assert d.is_contiguous(), k
        else:
            assert d.stride() == src[k].stride(), k
        assert same_values(src[k], d), k
        assert hostreg.registration(d.data_ptr()) is not None, k
    del staged, d
    assert released(baseline)


def test_views_and_tied_weights_are_staged_once(baseline):
    # Tensors sharing a storage are staged once, with their view relations: bytes staged equal
    # the unique bytes they touch, and a write to one shows in the others, as in the source.
    qkv = torch.randn(3 * 64, 32)
    emb = torch.randn(100, 32)
    src = {
        "emb": emb,
        "lm_head": emb,
        "q": qkv[:64],
        "k": qkv[64:128],
        "v": qkv[128:],
        "qkv": qkv,
        "row": emb[7],
        "other": torch.randn(10),
    }
    staged = ht.create_cpu_state_dict(src)
    ht.copy_state_dict(src, staged)
    assert all(same_values(src[k], staged[k]) for k in src)
    assert staged["lm_head"].data_ptr() == staged["emb"].data_ptr()
    assert staged["lm_head"].untyped_storage().data_ptr() == staged["emb"].untyped_storage().data_ptr()
    assert staged["q"].untyped_storage().data_ptr() == staged["qkv"].untyped_storage().data_ptr()
    assert staged["row"].data_ptr() == staged["emb"].data_ptr() + 7 * 32 * 4
    unique = qkv.nbytes + emb.nbytes + src["other"].nbytes
    staged_bytes = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in staged.values()}.values())
    assert staged_bytes == unique, (staged_bytes, unique)
    staged["emb"][0, 0] = 123.0
    assert staged["lm_head"][0, 0] == 123.0  # tied, as in the source
    # Copying again reuses the plan: one memcpy per unique storage.
    src["emb"].add_(1)
    ht.copy_state_dict(src, staged)
    assert torch.equal(staged["lm_head"], src["emb"])
    # A source no longer tied into a tied destination would corrupt it: refused.
    untied = dict(src, lm_head=src["emb"].clone())
    with pytest.raises(ValueError, match="share storage") as exc:
        ht.copy_state_dict(untied, staged)
    del staged, exc
    assert released(baseline)


def test_parameters_accepted():
    m = torch.nn.Linear(7, 3)
    src = {"weight": m.weight, "bias": m.bias, "plain": torch.nn.Parameter(torch.ones(4), requires_grad=False)}
    staged = ht.create_cpu_state_dict(src)
    check_one_arena(list(src.values()), list(staged.values()), registered=True)
    ht.copy_state_dict(src, staged)
    assert all(torch.equal(staged[k], src[k].detach()) for k in src)
    assert not any(t.requires_grad for t in staged.values())
    del staged


class DTensorLike(torch.Tensor):
    """A tensor subclass standing in for DTensor / ShardedTensor."""


@pytest.mark.parametrize(
    "bad, cause",
    [
        (lambda: torch.ones(4, 4).as_subclass(DTensorLike), "DTensorLike"),
        (lambda: torch.eye(4).to_sparse(), "sparse"),
        (lambda: torch.eye(4).to_sparse_csr(), "sparse_csr"),
    ],
    ids=["subclass", "sparse_coo", "sparse_csr"],
)
def test_unsupported_tensor_raises_type_error(bad, cause: str, baseline):
    src = {"good": torch.ones(1 << 16), "nested": {"bad": bad()}}
    with pytest.raises(TypeError) as exc:
        ht.create_cpu_state_dict(src)
    assert cause in str(exc.value)
    assert "nested.bad" in str(exc.value), "the message should say which entry"
    del exc
    assert released(baseline), "a failed staging left a registration or lock behind"


class NoAddress(torch.Tensor):
    """A subclass whose data_ptr() raises something other than torch's RuntimeError."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.data_ptr:
            raise AttributeError("no address here")
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize(
    "bad, cause",
    [
        (lambda: torch.ones(4, 4).as_subclass(DTensorLike), "DTensorLike"),
        (lambda: torch.eye(4).to_sparse(), "sparse"),
        (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(2)]), "nested"),
        (lambda: torch.quantize_per_tensor(torch.ones(4, 4), 0.1, 0, torch.qint8), "quantized"),
        (lambda: torch.ones(4, 4).as_subclass(NoAddress), "NoAddress"),
    ],
    ids=["subclass", "sparse_coo", "nested", "quantized", "subclass_refusing_data_ptr"],
)
def test_a_stager_refuses_an_unsupported_tensor_in_a_structure_it_staged_before(bad, cause: str):
    # A sync restage skips the type check when the sources' key is the last stage's: a tensor
    # of another kind in the same place must still be refused, naming the entry.
    src = {"good": torch.ones(1 << 10), "nested": {"bad": torch.ones(4, 4)}}
    with ht.Stager(pin_memory=False, share_memory=False) as stager:
        stager.stage(src)
        stager.stage(src)  # the key is the last stage's: no check
        src["nested"]["bad"] = bad()
        with pytest.raises(TypeError, match=cause) as exc:
            stager.stage(src)
        assert "nested.bad" in str(exc.value)


@pytest.mark.parametrize("pin, share", [(False, True), (True, False), (False, False)])
def test_pin_and_share_options(pin: bool, share: bool, baseline):
    src = {"a": torch.randn(300, 7), "b": torch.arange(10), "c": torch.tensor(1.0)}
    staged = ht.create_cpu_state_dict(src, pin_memory=pin, share_memory=share)
    d_list = list(staged.values())
    check_one_arena(list(src.values()), d_list, registered=pin)
    assert all(in_shared_arena(d) == share for d in d_list if d.nbytes)
    assert hostreg.stats().registrations == baseline[0] + int(pin)
    if pin:
        assert hostreg.locked_bytes() - baseline[1] >= sum(t.nbytes for t in d_list)
    else:
        assert hostreg.locked_bytes() == baseline[1]
    ht.copy_state_dict(src, staged)
    assert all(torch.equal(src[k], staged[k]) for k in src)
    del staged, d_list
    assert released(baseline)


# ---- sharing with other processes ------------------------------------------------------


def _child_writes(t: torch.Tensor, q) -> None:
    # Runs in a spawned child: report what it received (in an arena mapped here, a storage of
    # its own bytes), then write into it.
    from hostreg.torch import _sharing

    q.put((_sharing.staging_buffer_of(t) is not None and t.untyped_storage().nbytes() == t.nbytes, t.tolist()))
    t.copy_(torch.arange(100, 100 + t.numel(), dtype=t.dtype).view(t.shape))


def test_staged_tensor_passes_to_spawned_child_without_copy(baseline):
    src = {"pad": torch.ones(3), "x": torch.arange(12, dtype=torch.int32).view(3, 4)}
    staged = ht.create_cpu_state_dict(src)
    ht.copy_state_dict(src, staged)
    x = staged["x"]
    ptr, reg = x.data_ptr(), hostreg.registration(x.data_ptr())
    assert reg is not None

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child_writes, args=(x, q))
    p.start()
    try:
        shared, seen = q.get(timeout=120)
        p.join(timeout=60)
    finally:
        if p.is_alive():
            p.kill()
            p.join()
    assert p.exitcode == 0
    assert shared and seen == src["x"].tolist()
    # The parent sees the child's write: same memory, not a copy. The tensor did not move.
    assert torch.equal(x, torch.arange(100, 112, dtype=torch.int32).view(3, 4))
    assert x.data_ptr() == ptr and hostreg.registration(ptr) == reg
    assert torch.equal(staged["pad"], torch.ones(3))
    q.close()
    del staged, x
    assert released(baseline)


# ---- copy_state_dict -------------------------------------------------------------------


def test_copy_rejects_other_tensor_count():
    staged = ht.create_cpu_state_dict({"a": torch.ones(3), "b": torch.ones(3)})
    with pytest.raises(ValueError):
        ht.copy_state_dict({"a": torch.ones(3)}, staged)
    with pytest.raises(ValueError):
        ht.copy_state_dict({"a": torch.ones(3), "b": torch.ones(3), "c": torch.ones(3)}, staged)
    del staged


def test_copy_rejects_other_shape():
    staged = ht.create_cpu_state_dict({"a": torch.ones(3), "b": torch.zeros(2, 3)})
    before = staged["b"].clone()
    with pytest.raises(ValueError, match=r"\(3, 2\)"):
        ht.copy_state_dict({"a": torch.ones(3), "b": torch.ones(3, 2)}, staged)
    assert torch.equal(staged["b"], before)
    with pytest.raises(ValueError):
        ht.copy_state_dict({"a": torch.ones(3), "b": torch.ones(6)}, staged)
    del staged


def test_copy_rejects_other_keys():
    # copy_state_dict's docstring: "Raises ValueError when the structures ... differ".
    staged = ht.create_cpu_state_dict({"a": torch.zeros(3), "b": torch.zeros(3)})
    outcomes = []
    for src in ({"a": torch.ones(3), "c": torch.ones(3)}, [torch.ones(3), torch.ones(3)]):
        try:
            ht.copy_state_dict(src, staged)
            outcomes.append(
                f"no error copying {type(src).__name__} {list(src.keys()) if isinstance(src, dict) else ''}"
            )
        except ValueError:
            outcomes.append("ValueError")
    del staged  # release before asserting: a failing test must not leak into the next ones
    assert outcomes == ["ValueError", "ValueError"]


def test_copy_with_keys_in_another_order_goes_by_key():
    # Same keys, another insertion order: values must land under their own key (as
    # PyTorch's _copy_state_dict does), or the call must refuse; never under another key.
    staged = ht.create_cpu_state_dict({"b": torch.zeros(3), "a": torch.zeros(3)})
    src = {"a": torch.full((3,), 1.0), "b": torch.full((3,), 2.0)}
    try:
        ht.copy_state_dict(src, staged)
        result = {k: v.tolist() for k, v in staged.items()}
    except ValueError:
        result = None
    del staged
    assert result in (None, {"b": [2.0, 2.0, 2.0], "a": [1.0, 1.0, 1.0]}), f"values landed under other keys: {result}"


def many_and_large() -> dict:
    g = torch.Generator().manual_seed(1)
    small = {f"s{i}": torch.randint(-(1 << 31), 1 << 31, (1024,), dtype=torch.int32, generator=g) for i in range(3000)}
    odd = {f"o{i}": torch.randint(0, 256, (4096 + 37 * i,), dtype=torch.uint8, generator=g) for i in range(7)}
    return {"small": small, "odd": odd, "large": torch.randn(16 * MiB, generator=g)}  # 64 MiB


def check_copied(src: dict, dst: dict) -> None:
    for k in src["small"]:
        assert torch.equal(dst["small"][k], src["small"][k]), k
    for k in src["odd"]:
        assert torch.equal(dst["odd"][k], src["odd"][k]), k
    assert torch.equal(dst["large"], src["large"])


@pytest.mark.parametrize("threads", [0, 1, 3, 7])
def test_copy_many_small_and_one_large(threads: int, baseline):
    src = many_and_large()
    staged = ht.create_cpu_state_dict(src)
    assert hostreg.stats().registrations == baseline[0] + 1
    check_one_arena(tensors_of(src), tensors_of(staged), registered=True)
    assert ht.copy_state_dict(src, staged, threads=threads) is staged
    check_copied(src, staged)

    # Second copy, new values, into the same staged dict: same memory, no new registration.
    stats1, locked1 = hostreg.stats(), hostreg.locked_bytes()
    ptrs = [t.data_ptr() for t in tensors_of(staged)]
    for t in tensors_of(src):
        t.bitwise_not_() if not t.is_floating_point() else t.neg_()
    ht.copy_state_dict(src, staged, threads=threads)
    check_copied(src, staged)
    assert hostreg.stats() == stats1 and hostreg.locked_bytes() == locked1
    assert [t.data_ptr() for t in tensors_of(staged)] == ptrs
    del staged
    assert released(baseline)


# ---- failure paths (child processes) ---------------------------------------------------

FAILURE_SCRIPT = textwrap.dedent(
    """
    import gc, json, os
    import torch, hostreg, hostreg.torch as ht
    src = {{"w": torch.empty({nbytes}, dtype=torch.uint8)}}
    out = {{"raised": None}}
    try:
        ht.create_cpu_state_dict(src)
    except hostreg.StagingError as e:
        out["raised"] = str(e)
    except BaseException as e:
        out["raised"] = "WRONG " + type(e).__name__ + ": " + str(e)
    gc.collect()
    out["registrations"] = hostreg.stats().registrations
    out["vmlck"] = hostreg.locked_bytes()
    out["shm"] = sorted(os.listdir("/dev/shm"))
    out["shm_size"] = os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize
    print("RESULT" + json.dumps(out))
    """
)


def run_failure(nbytes: int, *prefix: str) -> dict:
    import json

    r = run_python(FAILURE_SCRIPT.format(nbytes=nbytes), *prefix, timeout=120)
    assert r.returncode == 0, f"the process did not survive (rc {r.returncode}):\n{r.stdout}\n{r.stderr}"
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, r.stdout + r.stderr
    return json.loads(line[-1][len("RESULT") :])


def test_memlock_limit_raises_staging_error():
    out = run_failure(64 * MiB, *low_memlock(8192))
    assert out["raised"] and not out["raised"].startswith("WRONG"), out
    assert "RLIMIT_MEMLOCK" in out["raised"]
    assert out["registrations"] == 0 and out["vmlck"] == 0


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a private /dev/shm needs root")


@needs_root
def test_small_dev_shm_raises_staging_error():
    # A private mount namespace with a 64 MiB /dev/shm (the container default); stage 256 MiB.
    small_shm = ("unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" "$@"')
    probe = subprocess.run([*small_shm, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a private /dev/shm here: {probe.stderr.strip()}")
    out = run_failure(256 * MiB, *small_shm)
    assert out["shm_size"] == 64 * MiB
    msg = out["raised"]
    assert msg and not msg.startswith("WRONG"), out
    assert "/dev/shm" in msg and "67,108,864" in msg and "268,435,456" in msg, msg
    assert out["shm"] == [], "staging left files in /dev/shm"
    assert out["registrations"] == 0 and out["vmlck"] == 0


# ---- found by a second adversarial review ----------------------------------------------


def test_copy_follows_a_replaced_destination_tensor(baseline):
    src = {"w": torch.full((1 << 16,), 7.0), "v": torch.ones(8)}
    staged = ht.create_cpu_state_dict(src)
    ht.copy_state_dict(src, staged)
    staged["w"].data = torch.zeros(1 << 16)  # the staged tensor now lives elsewhere
    ht.copy_state_dict({"w": torch.full((1 << 16,), 3.0), "v": torch.ones(8)}, staged)
    assert torch.equal(staged["w"], torch.full((1 << 16,), 3.0))
    del staged
    assert released(baseline)


def test_quantized_tensors_are_refused(baseline):
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8)
    with pytest.raises(TypeError, match="quantized"):
        ht.create_cpu_state_dict({"q": q})
    assert released(baseline)


def test_stager_is_safe_from_several_threads(baseline):
    import threading

    stager = ht.Stager(max_buffers=4, wait_timeout_s=30)
    wrong: list[int] = []

    def worker(i: int) -> None:
        for _ in range(5):
            out = stager.stage({"w": torch.full((4096,), float(i))})
            if not torch.equal(out["w"], torch.full((4096,), float(i))):
                wrong.append(i)
            del out

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [] and stager.arenas_created <= 4
    stager.close()
    assert released(baseline)


def test_file_system_sharing_strategy_does_not_move_a_staged_dict():
    # torch's own reducer, under file_system, copies a storage it did not allocate shared into
    # a new file (once a segfault here). hostreg's reducer sends the arena's file instead,
    # whatever the strategy: the staged tensors stay where they are and the arena is reused.
    code = textwrap.dedent(
        """
        import io, torch, hostreg, hostreg.torch as ht, torch.multiprocessing as mp
        from multiprocessing.reduction import ForkingPickler
        mp.set_sharing_strategy("file_system")
        s = ht.Stager(); sd = {"w": torch.arange(float(1 << 16))}
        out = s.stage(sd); ForkingPickler(io.BytesIO()).dump(out); del out
        out = s.stage(sd)
        print(torch.equal(out["w"], sd["w"]), hostreg.stats().registrations, s.arenas_created)
        del out; s.close(); print(hostreg.stats().registrations)
        """
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "1", "1", "0"]


def test_a_first_staging_does_not_import_dtensor_and_a_later_dtensor_is_still_one():
    # No DTensor exists before its class is imported, so staging plain tensors leaves that
    # import (about 0.4 s: it brings sympy) to the program; a DTensor the program makes later
    # is staged as one, shard and placement, by the same Stager.
    code = textwrap.dedent(
        """
        import sys, tempfile, torch, hostreg, hostreg.torch as ht
        s = ht.Stager()
        out = s.stage({"w": torch.ones(8)}); del out
        print("torch.distributed.tensor" in sys.modules)
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard, distribute_tensor
        dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + tempfile.mktemp())
        d = distribute_tensor(torch.arange(8.0), init_device_mesh("cpu", (1,)), [Shard(0)])
        out = s.stage({"w": torch.ones(8), "d": d})
        print(type(out["d"]) is DTensor, out["d"].placements == d.placements, torch.equal(out["d"].to_local(), d.to_local()))
        del out; s.close(); dist.destroy_process_group()
        print(hostreg.stats().registrations)
        """
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "True", "True", "0"]


def test_a_stager_buffer_whose_storage_moved_is_never_reused():
    # torch's own file_system sharing (Storage._share_filename_cpu_, what its reducer calls)
    # moves a storage's bytes into a new file in place. Such a buffer's copy plan points at the
    # old memory: the next stage must make a new arena, copy right, and release the old one.
    s = ht.Stager()
    regs = hostreg.stats().registrations
    try:
        sd = {"w": torch.arange(float(1 << 16))}
        out = s.stage(sd)
        st = out["w"].untyped_storage()
        before = st.data_ptr()
        st._share_filename_cpu_()
        assert st.data_ptr() != before, "torch no longer moves the storage: this test needs another way"
        del out, st
        sd["w"] += 1
        out = s.stage(sd)
        assert torch.equal(out["w"], sd["w"])
        assert s.arenas_created == 2
        assert hostreg.stats().registrations == regs + 1  # the moved arena's registration is gone
        del out
    finally:
        s.close()
    assert hostreg.stats().registrations == regs


@pytest.mark.parametrize("count", [2**61, 2**62, 3 * 2**61], ids=["2**63-bytes", "2**64-bytes", "1.5*2**64-bytes"])
def test_a_state_dict_beyond_the_address_space_is_a_staging_error(count: int):
    # An expanded tensor stages its full size (its own span, values resolved): 4 * count bytes.
    sd = {"x": torch.ones(1).expand(count)}
    with pytest.raises(
        hostreg.StagingError, match=r"cannot stage [\d,]+ bytes of staging memory: cudaErrorMemoryAllocation \(2\)"
    ):
        ht.create_cpu_state_dict(sd)
    assert hostreg.stats().registrations == 0


def test_a_meta_state_dict_gets_bytes_of_its_own_per_tensor():
    # Deferred init: every meta tensor reports storage address 0; they must not be staged as one.
    with torch.device("meta"):
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 8))
    meta = model.state_dict()
    staged = ht.create_cpu_state_dict(meta)
    spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes) for t in staged.values())
    assert all(a_end <= b for (_, a_end), (b, _) in zip(spans, spans[1:])), "no two tensors share bytes"
    assert all(staged[k].shape == meta[k].shape and staged[k].device.type == "cpu" for k in meta)
    with pytest.raises(NotImplementedError, match="no data"):
        ht.copy_state_dict(meta, staged)  # nothing to copy from a meta tensor: torch's own refusal
    real = {k: torch.randn(v.shape) for k, v in meta.items()}
    ht.copy_state_dict(real, staged)  # what the staging memory is for: loading real values into it
    assert all(torch.equal(staged[k], real[k]) for k in real)
    del staged
    gc.collect()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for a ramfs in a mount namespace of its own (unshare -m)")
def test_shm_dir_on_a_filesystem_without_a_size_limit():
    # ramfs (like tmpfs size=0 and hugetlbfs without size=) reports 0 blocks: no limit to check
    # against, not "0 bytes free of 0".
    ramfs = ("unshare", "-m", "sh", "-c", 'mount -t ramfs none /mnt && exec "$@"', "sh")
    code = textwrap.dedent("""
        import json, torch, hostreg, hostreg.torch as ht
        from hostreg import doctor
        staged = ht.create_cpu_state_dict({"w": torch.ones(1 << 20)})
        ht.copy_state_dict({"w": torch.full((1 << 20,), 2.0)}, staged)
        d = doctor.diagnose(1 << 22)
        print(json.dumps([bool(torch.all(staged["w"] == 2.0)), doctor.verdict(d), d.shm_bytes]))
    """)
    r = subprocess.run(
        [*ramfs, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HOSTREG_SHM_DIR": "/mnt", "HOSTREG_BACKEND": "posix"},
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [True, [], 0]


@pytest.mark.parametrize("collector_on", [True, False])
def test_staging_leaves_the_garbage_collector_as_it_found_it(collector_on: bool):
    """Stager pauses the cyclic collector while it makes its per-tensor objects: afterwards it is
    on again if it was on (also when the copy raises), and stays off if the caller had it off."""
    st = ht.Stager()
    was = gc.isenabled()
    try:
        (gc.enable if collector_on else gc.disable)()
        sd = {"a": torch.ones(8), "b": torch.zeros(4)}
        staged = st.stage(sd)
        assert gc.isenabled() is collector_on
        del staged
        sd["a"].untyped_storage().resize_(0)  # freed: the restage's copy refuses it
        with pytest.raises(RuntimeError, match="freed or resized"):
            st.stage(sd)
        assert gc.isenabled() is collector_on
    finally:
        (gc.enable if was else gc.disable)()
        st.close()


def test_a_restage_of_unchanged_sources_replays_the_last_copy_and_follows_every_change():
    """A Stager's restage of sources that lie where, and are viewed as, they were skips the
    layout and replays the last memcpy batch; any change a source's memory or view can take
    (another storage, strides, dtype, a conjugate bit, the structure) is staged from scratch,
    with the values it has."""
    from hostreg.torch import _stager

    layouts = []
    real_layout_of = _stager.layout_of

    def counting(*a, **kw):
        layouts.append(1)
        return real_layout_of(*a, **kw)

    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, 4, generator=g)
    c = torch.randn(5, generator=g, dtype=torch.complex64)
    b = torch.randn(7, generator=g)
    st = ht.Stager(pin_memory=False)
    _stager.layout_of = counting
    try:

        def stage(sd: dict) -> dict:
            out = st.stage(sd)
            for k, v in sd.items():
                if isinstance(v, torch.Tensor):
                    assert out[k].dtype == v.dtype and out[k].shape == v.shape, k
                    assert torch.equal(out[k].resolve_conj(), v.resolve_conj()), k
                else:
                    assert out[k] == v
            return out

        stage({"w": w, "c": c, "b": b})
        assert len(layouts) == 1
        w.add_(1.0)  # new values, same memory: a replay, with the new values
        stage({"w": w.detach(), "c": c, "b": b})  # new tensor objects (as state_dict() makes) over the same memory
        assert len(layouts) == 1
        plan = st._pool.slots[0].plan
        assert plan._replay is not None
        steps = [
            lambda: {"w": w.t(), "c": c, "b": b},  # strides
            lambda: {"w": w, "c": c.conj(), "b": b},  # a conjugate view of the same bytes
            lambda: {"w": w.view(torch.int32), "c": c, "b": b},  # dtype
            lambda: {"w": w.clone(), "c": c, "b": b},  # another storage
            lambda: {"w": w, "c": c, "b": b, "x": 1},  # the structure
            lambda: {"w": w[1:], "c": c, "b": b},  # storage offset
        ]
        for n, make in enumerate(steps, start=2):
            stage(make())
            assert len(layouts) == n, n
        stage(steps[-1]())  # and unchanged again: a replay
        assert len(layouts) == len(steps) + 1
    finally:
        _stager.layout_of = real_layout_of
        st.close()


def test_the_first_copy_after_create_takes_the_layouts_grouping_only_for_the_same_sources(monkeypatch):
    # create_cpu_state_dict has grouped the sources for the layout: the copy that follows, from
    # those very sources, must not group them again; from other sources (here: untied where the
    # layout's were tied), it must, and it then refuses what would overwrite one with the other.
    from hostreg.torch import _copy

    calls = []
    real_group = _copy.group
    monkeypatch.setattr(_copy, "group", lambda ts: calls.append(len(ts)) or real_group(ts))
    g = torch.Generator().manual_seed(5)
    base = torch.randn(64, generator=g)
    src = {"a": base[:32], "b": base[32:], "c": torch.randn(3, 5, generator=g).t()}
    dst = ht.create_cpu_state_dict(src, pin_memory=False, share_memory=False)
    calls.clear()  # create_cpu_state_dict measured the destinations' grouping for the plan
    ht.copy_state_dict(src, dst)
    assert calls == [], "the first copy grouped its sources again"
    assert all(torch.equal(dst[k], src[k]) for k in src)
    assert dst["a"].untyped_storage().data_ptr() == dst["b"].untyped_storage().data_ptr()  # one span, as the source
    other = {"a": torch.randn(32, generator=g), "b": torch.randn(32, generator=g), "c": src["c"]}
    with pytest.raises(ValueError, match="share storage"):  # untied sources into tied destinations
        ht.copy_state_dict(other, dst)
    assert calls, "sources other than the layout's were not grouped"
    ht.copy_state_dict(src, dst)  # the layout's sources again, changed: grouped, copied span by span
    assert all(torch.equal(dst[k], src[k]) for k in src)


def test_a_layouts_destination_grouping_is_what_grouping_the_staged_tensors_gives():
    # Copy plans of freshly staged tensors take their grouping from the layout instead of
    # measuring them: it must be exactly the measured one, for every kind of leaf.
    from hostreg.torch import _layout

    g = torch.Generator().manual_seed(6)
    base = torch.randn(10, 12, generator=g)
    cplx = torch.randn(4, dtype=torch.complex64, generator=g)
    sd = {
        "tied": [base, base],
        "views": {"row": base[3], "col": base[:, 5], "t": base.t(), "slice": base[2:7, 1:4]},
        "odd": base.view(-1)[3:11],  # starts off the 16-byte grid of its storage
        "conj": cplx.conj(),
        "neg": torch._neg_view(torch.randn(5, generator=g)),
        "expanded": torch.randn(1, 6, generator=g).expand(4, 6),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(2.5),
        "half": torch.randn(7, generator=g).half(),
    }
    layout, _, _ = _layout.layout_of(sd)
    staged = ht.create_cpu_state_dict(sd, pin_memory=False, share_memory=False)
    leaves, _, _ = _layout.flatten_checked(staged)
    assert layout.grouping.as_destination() == _layout.group(leaves)
    # Values too: a conjugate or negative view whose span index is not its tensor index (tied
    # tensors before it) is resolved, not copied as its raw bytes.
    ht.copy_state_dict(sd, staged)
    for a, b in zip(_layout.flatten_checked(sd)[0], leaves):
        assert torch.equal(a.resolve_conj().resolve_neg(), b)
    with ht.Stager(pin_memory=False, share_memory=False) as stager:
        for _ in range(2):  # the first stage and a replay
            out = _layout.flatten_checked(stager.stage(sd))[0]
            assert all(
                torch.equal(a.resolve_conj().resolve_neg(), b) for a, b in zip(_layout.flatten_checked(sd)[0], out)
            )
            del out
    with torch.device("meta"):
        meta = {"w": torch.empty(3, 4), "v": torch.empty(5), "view": torch.empty(10)[3:], "e": torch.empty(4)[4:]}
    layout, _, _ = _layout.layout_of(meta)
    staged = ht.create_cpu_state_dict(meta, pin_memory=False, share_memory=False)
    assert layout.grouping.as_destination() == _layout.group(list(staged.values()))


def test_staged_tensors_of_every_dtype_hold_exactly_their_bytes():
    # A tensor alone in its span is made over the arena as one DLPack view of its dtype, shape
    # and strides; others (dtypes DLPack does not name here, tensors sharing a span) with set_.
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16]
    dtypes += [torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128]
    dtypes += [getattr(torch, n) for n in ("float8_e4m3fn", "uint16", "uint32") if hasattr(torch, n)]
    g = torch.Generator().manual_seed(8)
    sd = {str(dt): (torch.randn(3, 5, generator=g) * 10).to(dt) for dt in dtypes}
    sd["t"] = torch.randn(4, 6, generator=g).t()  # alone in its storage, transposed
    sd["scalar"] = torch.tensor(7.0)
    staged = ht.create_cpu_state_dict(sd, pin_memory=False, share_memory=False)
    ht.copy_state_dict(sd, staged)
    for k, v in sd.items():
        got = staged[k]
        assert (got.dtype, got.shape, got.stride()) == (v.dtype, v.shape, v.stride()), k
        raw = got.dim() > 0 and got.is_contiguous()  # bytes compared: not every dtype has torch.equal
        assert torch.equal(got.view(torch.uint8), v.view(torch.uint8)) if raw else torch.equal(got, v), k
        assert got.untyped_storage().nbytes() == v.untyped_storage().nbytes(), k  # its bytes, no more
    from hostreg import _hostreg
    from hostreg.torch import _sharing

    buf = _sharing.staging_buffer_of(staged["t"])
    end = buf.data_ptr + buf.size
    code = 2 | 32 << 8  # float32
    with pytest.raises(ValueError, match="not inside the staging buffer"):
        _hostreg.typed_views(buf, [end - 8], [code], [[4]], [[1]])  # 16 bytes, 8 of them past the end
    with pytest.raises(ValueError, match="negative stride"):
        _hostreg.typed_views(buf, [buf.data_ptr], [code], [[2]], [[-1]])
    with pytest.raises(ValueError, match="same length"):
        _hostreg.typed_views(buf, [buf.data_ptr], [], [[2]], [[1]])
    # Sizes whose byte count wraps around 2**64 are refused, not handed to torch (which aborts).
    for shape, stride, dt in (([2**62 + 1], [4], 1 | 8 << 8), ([2**61 + 1], [1], 0 | 64 << 8)):
        with pytest.raises(ValueError, match="not inside the staging buffer"):
            _hostreg.typed_views(buf, [buf.data_ptr], [dt], [shape], [stride])
    with pytest.raises(TypeError, match="owner must be a StagingBuffer"):
        _hostreg.typed_views(object(), [buf.data_ptr], [code], [[2]], [[1]])


def test_a_destination_moved_with_set_is_measured_again_whichever_tensor_of_its_span_it_is():
    x = torch.arange(16.0).view(4, 4)
    src = {"a": x, "b": x[1:]}  # one storage, "b" not its span's first tensor
    dst = ht.create_cpu_state_dict(src, pin_memory=False, share_memory=False)
    ht.copy_state_dict(src, dst)
    dst["b"].set_(torch.zeros(3, 4))  # same object, dtype, shape and strides; other memory
    x.add_(100)
    ht.copy_state_dict(src, dst)
    assert torch.equal(dst["a"], src["a"]) and torch.equal(dst["b"], src["b"])


def test_conjugate_and_negative_destinations_are_written_as_copy_writes_them():
    src = {"a": torch.tensor([1 + 2j, 3 - 4j]), "b": torch.tensor([1.0, 2.0])}
    dst = ht.create_cpu_state_dict(src, pin_memory=False, share_memory=False)
    dst["a"] = dst["a"].conj()
    dst["b"] = dst["b"]._neg_view()
    ht.copy_state_dict(src, dst)
    assert torch.equal(dst["a"], src["a"]) and torch.equal(dst["b"], src["b"])  # as Tensor.copy_ leaves them


def test_copies_from_parameters_record_no_autograd_history():
    # torch's _copy_state_dict runs under no_grad; a staged tensor with a grad_fn could not be
    # sent to the background checkpoint process (ForkingPickler refuses non-leaf tensors).
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler

    g = torch.Generator().manual_seed(9)
    p = torch.nn.Parameter(torch.randn(1, 4, generator=g).expand(3, 4))
    q = torch.nn.Parameter(torch.randn(4, 3, generator=g))
    d = ht.create_cpu_state_dict({"p": p, "q": q}, pin_memory=False, share_memory=True)
    ht.copy_state_dict({"p": p, "q": torch.nn.Parameter(torch.randn(3, 4, generator=g).t())}, d)
    assert all(t.grad_fn is None and not t.requires_grad for t in d.values())
    ForkingPickler(io.BytesIO(), pickle.HIGHEST_PROTOCOL).dump(d)


def test_copy_state_dict_replays_only_while_sources_and_destinations_stay_put():
    g = torch.Generator().manual_seed(4)
    src = {"w": torch.randn(8, 8, generator=g), "b": torch.randn(8, generator=g)}
    dst = ht.create_cpu_state_dict(src, pin_memory=False, share_memory=False)
    ht.copy_state_dict(src, dst)
    from hostreg.torch import _sharing, _state_dict

    plan = _state_dict._plans[_sharing.staging_buffer_of(dst["w"])]
    assert plan._replay is not None  # the next copy of the same tensors replays this one's batch
    src["w"].mul_(2)
    ht.copy_state_dict(src, dst)
    assert torch.equal(dst["w"], src["w"]) and torch.equal(dst["b"], src["b"])
    # A destination moved to other memory in place (same object, shape and dtype): the copy
    # goes there, not to where the replayed batch would write.
    dst["w"].set_(torch.empty_like(dst["w"]))
    src["w"].add_(1)
    ht.copy_state_dict(src, dst)
    assert torch.equal(dst["w"], src["w"])
    # A source viewed anew over the same memory (transposed): its values as now viewed.
    ht.copy_state_dict({"w": src["w"].t(), "b": src["b"]}, dst)
    assert torch.equal(dst["w"], src["w"].t())
