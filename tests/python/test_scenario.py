"""The scenario that failed without CUDA (docs/pytorch.md), run through
PyTorch's own _create_cpu_state_dict / _copy_state_dict with hostreg installed."""

from __future__ import annotations

import gc
import io

import pytest
import torch
from torch.distributed._state_dict_utils import (
    _check_state_dict_similarity,
    _copy_state_dict,
    _create_cpu_state_dict,
)

import hostreg
import hostreg.torch as ht


@pytest.fixture(autouse=True)
def installed():
    ht.install()
    yield
    gc.collect()  # let PyTorch's finalizers unregister through the drop-in first
    ht.uninstall()


def make_state_dict() -> dict:
    saved = io.BytesIO()
    torch.save(torch.arange(4.0), saved)
    saved.seek(0)
    return {
        "weight": torch.arange(10, dtype=torch.float32),
        "bias": torch.ones(10),
        "buffer": saved,
        "raw": saved.getvalue(),
        "step": torch.tensor(7.0),
        "lr": 1.5,
        "nested": {"list": [1, "two", torch.full((3,), 3.0)]},
    }


def check_values(src: dict, dst: dict) -> None:
    assert torch.equal(dst["weight"], src["weight"]) and torch.equal(dst["bias"], src["bias"])
    assert dst["step"].item() == 7.0 and dst["lr"] == 1.5
    assert dst["raw"] == src["raw"]
    assert dst["buffer"].getvalue() == src["raw"]
    assert torch.equal(torch.load(io.BytesIO(dst["buffer"].getvalue()), weights_only=True), torch.arange(4.0))
    assert dst["nested"]["list"][:2] == [1, "two"]
    assert torch.equal(dst["nested"]["list"][2], torch.full((3,), 3.0))


@pytest.mark.parametrize("pin", [False, True], ids=["shared", "shared+pinned"])
def test_failing_scenario(pin: bool):
    src = make_state_dict()
    regs0, locked0 = hostreg.stats().registrations, hostreg.locked_bytes()

    cpu = _create_cpu_state_dict(src, pin_memory=pin, share_memory=True)
    assert _check_state_dict_similarity(src, cpu)
    other = dict(src, weight=torch.zeros(11))
    assert not _check_state_dict_similarity(other, cpu)

    big = [cpu["weight"], cpu["bias"], cpu["nested"]["list"][2]]
    assert all(t.is_shared() for t in big)
    if pin:
        # Each non-0-d tensor is really registered and really locked (kernel's VmLck).
        regs = [hostreg.registration(t.data_ptr()) for t in big]
        assert [(r.base, r.nbytes) for r in regs if r] == [(t.data_ptr(), t.nbytes) for t in big]
        assert hostreg.stats().registrations == regs0 + 3
        assert hostreg.locked_bytes() - locked0 >= sum(t.nbytes for t in big)
    else:
        assert hostreg.stats().registrations == regs0

    _copy_state_dict(src, cpu)
    check_values(src, cpu)

    del cpu, big, other
    gc.collect()
    assert hostreg.stats().registrations == regs0
    assert hostreg.locked_bytes() == locked0


def test_reused_memory_registers_again():
    # PyTorch #131270: registrations never undone made later ones over reused memory fail.
    src = {"w": torch.randn(1 << 16)}
    for _ in range(5):
        cpu = _create_cpu_state_dict(src, pin_memory=True, share_memory=True)
        _copy_state_dict(src, cpu)
        assert torch.equal(cpu["w"], src["w"])
        del cpu
        gc.collect()
    assert hostreg.stats().registrations == 0
