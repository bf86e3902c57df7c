"""hostreg.torch.install(): falls back to hostreg only where torch has no CUDA runtime."""

from __future__ import annotations

import pytest
import torch
import torch.cuda
from conftest import Buffer

import hostreg
import hostreg.torch as ht


@pytest.fixture
def fake_cudart(monkeypatch):
    """Replace torch.cuda.cudart (before install) with a function whose behaviour the test sets."""
    ht.uninstall()
    behaviour: dict[str, object] = {}

    def cudart():
        if "raise" in behaviour:
            raise behaviour["raise"]  # type: ignore[misc]
        return behaviour.get("return")

    monkeypatch.setattr(torch.cuda, "cudart", cudart)
    yield behaviour
    ht.uninstall()


def test_cpu_build_falls_back_to_hostreg():
    ht.install()
    try:
        assert torch.cuda.cudart() is hostreg.cudart()
    finally:
        ht.uninstall()
    with pytest.raises(AssertionError, match="not compiled with CUDA"):
        torch.cuda.cudart()  # torch's own again


@pytest.mark.parametrize(
    "raised",
    [
        AssertionError("Torch not compiled with CUDA enabled"),
        AssertionError("libcudart functions unavailable. It looks like you have a broken build?"),
    ],
)
def test_no_cuda_assertions_fall_back(fake_cudart, raised):
    fake_cudart["raise"] = raised
    ht.install()
    assert torch.cuda.cudart() is hostreg.cudart()


def test_none_falls_back(fake_cudart):  # what torch_npu's transfer_to_npu causes
    fake_cudart["return"] = None
    ht.install()
    assert torch.cuda.cudart() is hostreg.cudart()


@pytest.mark.parametrize(
    "raised",
    [
        RuntimeError("Cannot re-initialize CUDA in forked subprocess."),
        AssertionError("some other assertion"),
        OSError("boom"),
    ],
)
def test_other_exceptions_propagate(fake_cudart, raised):
    fake_cudart["raise"] = raised
    ht.install()
    with pytest.raises(type(raised), match=str(raised)[:10]):
        torch.cuda.cudart()


def test_working_cuda_runtime_is_kept(fake_cudart):
    real = object()
    fake_cudart["return"] = real
    ht.install()
    assert torch.cuda.cudart() is real


def test_install_is_idempotent_and_reversible(fake_cudart):
    original = torch.cuda.cudart
    ht.install()
    wrapper = torch.cuda.cudart
    ht.install()
    assert torch.cuda.cudart is wrapper and wrapper is not original
    assert ht.is_installed()
    ht.uninstall()
    ht.uninstall()
    assert torch.cuda.cudart is original and not ht.is_installed()


def test_profiler_module_binding_is_wrapped_too():
    import torch.cuda.profiler as profiler

    ht.install()
    try:
        assert profiler.cudart() is hostreg.cudart()
        assert profiler.cudart().cudaProfilerStart() == 801  # honest failure, not a fake success
    finally:
        ht.uninstall()


def test_uninstall_warns_about_live_registrations(buf: Buffer):
    ht.install()
    assert hostreg.host_register(buf.addr, 4096) == 0
    with pytest.warns(RuntimeWarning, match="1 registrations are still live"):
        ht.uninstall()
    assert hostreg.host_unregister(buf.addr) == 0


def test_pin_memory_utils_work_through_the_dropin(buf: Buffer):
    pmu = pytest.importorskip("torch.cuda._pin_memory_utils")
    ht.install()
    try:
        before = hostreg.locked_bytes()
        pmu.pin_memory(buf.addr, buf.nbytes)
        assert hostreg.locked_bytes() - before == buf.nbytes
        with pytest.raises(RuntimeError, match="cudaError: 712"):
            pmu.pin_memory(buf.addr, 10)
        pmu.unpin_memory(buf.addr)
        assert hostreg.locked_bytes() == before
        with pytest.raises(AssertionError, match="error-code: 713"):
            pmu.unpin_memory(buf.addr)
    finally:
        ht.uninstall()


def test_check_error_works_after_install():
    """torch.cuda.check_error reads torch.cuda._cudart, None on a CPU build: without the
    drop-in even success raises AttributeError."""
    ht.uninstall()
    if torch.cuda._cudart is not None:
        pytest.skip("this torch has its own CUDA runtime")
    with pytest.raises(AttributeError):
        torch.cuda.check_error(0)
    ht.install()
    try:
        torch.cuda.check_error(0)
        with pytest.raises(torch.cuda.CudaError, match=r"\(712\)"):
            torch.cuda.check_error(712)
    finally:
        ht.uninstall()
    assert torch.cuda._cudart is None


def test_failed_registration_through_the_dropin_is_logged_as_warning(buf: Buffer, caplog):
    ht.install()
    try:
        rt = torch.cuda.cudart()
        assert rt.cudaHostRegister(buf.addr, buf.nbytes, 1) == 0
        with caplog.at_level("WARNING", logger="hostreg"):
            code = rt.cudaHostRegister(buf.addr + 4096, 4096, 1)  # inside the registration
        assert code == 712
        warned = [r for r in caplog.records if r.levelname == "WARNING" and r.name == "hostreg"]
        assert warned and "cudaHostRegister" in warned[0].getMessage() and "712" in warned[0].getMessage()
        assert hostreg.last_error().message in warned[0].getMessage()  # hostreg's reason, not just the code
        caplog.clear()
        with caplog.at_level("WARNING", logger="hostreg"):
            assert hostreg.host_register(buf.addr + 4096, 4096) == 712  # hostreg's own API: the caller's mistake, DEBUG
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        assert rt.cudaHostUnregister(buf.addr) == 0
    finally:
        ht.uninstall()
