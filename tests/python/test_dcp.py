"""hostreg.torch.Stager as DCP's AsyncStager (python/hostreg/torch/_stager.py) with
torch.distributed.checkpoint: round trips, constant resources across saves (PyTorch
#170163), no reuse of a buffer a writer still reads (Megatron-LM PR #2288), close(), and
two ranks over gloo (thread and background-process checkpointers)."""

from __future__ import annotations

import gc
import os
import threading
import time
from concurrent.futures import Future

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import torch_save_threads_joined
from ranks import run_ranks
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint.staging import AsyncStager

import hostreg
import hostreg.torch as ht

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


# ---- helpers ---------------------------------------------------------------------------


class Net(torch.nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(16, width)
        self.norm = torch.nn.BatchNorm1d(width)  # buffers, incl. a 0-d int64 num_batches_tracked
        self.fc2 = torch.nn.Linear(width, 4, bias=False)
        self.register_buffer("scale16", torch.randn(3, 5).to(torch.float16))


def mutate(model: torch.nn.Module, step: int) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(float(step))
        model.norm.num_batches_tracked.fill_(step)


def snapshot(sd: dict) -> dict:
    return {k: v.detach().clone() for k, v in sd.items()}


def load(path, like: dict) -> dict:
    out = {k: torch.full_like(v, 7) if v.dtype != torch.bool else torch.zeros_like(v) for k, v in like.items()}
    dcp.load(out, checkpoint_id=str(path), no_dist=True)
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert torch.equal(a[k], b[k]), k


def shm_fds() -> int:
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += "/dev/shm" in os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return n


def resources() -> tuple:
    torch_save_threads_joined()
    gc.collect()
    return hostreg.locked_bytes(), hostreg.stats(), shm_fds()


@pytest.fixture
def stager():
    s = ht.Stager()
    yield s
    s.close()


# ---- single process ----------------------------------------------------------------------


def test_is_an_async_stager():
    s = ht.Stager()
    assert isinstance(s, AsyncStager)
    assert s.should_synchronize_after_execute is False
    s.close()


def test_async_save_and_load_round_trip(stager, tmp_path):
    torch.manual_seed(0)
    model = Net()
    sd = model.state_dict()
    want = snapshot(sd)
    fut = dcp.async_save(sd, checkpoint_id=str(tmp_path / "ckpt"), async_stager=stager, no_dist=True)
    fut.result(timeout=120)
    assert stager.arenas_created == 1 and hostreg.stats().registrations >= 1
    assert_same(load(tmp_path / "ckpt", want), want)


def test_repeated_saves_keep_resources_constant(stager, tmp_path):
    torch.manual_seed(0)
    model = Net()
    saved = []
    after_first = None
    for i in range(20):
        mutate(model, i)
        sd = model.state_dict()
        saved.append(snapshot(sd))
        fut = dcp.async_save(sd, checkpoint_id=str(tmp_path / f"c{i}"), async_stager=stager, no_dist=True)
        fut.result(timeout=120)
        del fut
        now = (*resources(), stager.arenas_created)
        if after_first is None:
            after_first = now
            assert now[1].registrations == 1 and now[2] >= 1 and now[3] == 1
        assert now == after_first, f"save {i}: (VmLck, stats, /dev/shm fds, arenas) {now} != {after_first}"
    # Each checkpoint holds the values of its own save, not a later one's.
    for i in (0, 3, 11, 19):
        assert_same(load(tmp_path / f"c{i}", saved[i]), saved[i])
    assert not torch.equal(saved[0]["fc1.weight"], saved[19]["fc1.weight"])


def test_structure_change_rebuilds_and_releases_old_arena(stager, tmp_path):
    torch.manual_seed(0)
    small, large = Net(32), Net(256)
    dcp.async_save(small.state_dict(), checkpoint_id=str(tmp_path / "a"), async_stager=stager, no_dist=True).result()
    locked_small = resources()[0]
    assert stager.arenas_created == 1
    want = snapshot(large.state_dict())
    dcp.async_save(large.state_dict(), checkpoint_id=str(tmp_path / "b"), async_stager=stager, no_dist=True).result()
    locked, stats, _ = resources()
    assert stager.arenas_created == 2
    assert stats.registrations == 1, "the old arena was not released"
    assert stats.bytes_registered >= sum(t.nbytes for t in want.values())
    assert locked > locked_small
    assert_same(load(tmp_path / "b", want), want)
    # Back to the first structure: rebuilt again, still one registration.
    dcp.async_save(small.state_dict(), checkpoint_id=str(tmp_path / "c"), async_stager=stager, no_dist=True).result()
    assert stager.arenas_created == 3 and resources()[1].registrations == 1


def test_never_overwrites_a_buffer_still_in_use(stager):
    torch.manual_seed(0)
    sd1 = {"w": torch.randn(1000), "n": {"b": torch.arange(7)}, "step": 1}
    sd2 = {"w": torch.randn(1000), "n": {"b": torch.arange(7) * 3}, "step": 2}
    sd3 = {"w": torch.randn(1000), "n": {"b": torch.arange(7) * 5}, "step": 3}
    d1 = stager.stage(sd1)
    want1 = snapshot({"w": d1["w"], "b": d1["n"]["b"]})
    assert torch.equal(d1["w"], sd1["w"]) and d1["step"] == 1
    d2 = stager.stage(sd2)  # same structure; d1 is alive, so another arena
    assert stager.arenas_created == 2
    assert torch.equal(d1["w"], want1["w"]) and torch.equal(d1["n"]["b"], want1["b"]), "stage() overwrote a live buffer"
    assert torch.equal(d2["w"], sd2["w"]) and torch.equal(d2["n"]["b"], sd2["n"]["b"]) and d2["step"] == 2
    assert d1["w"].untyped_storage().data_ptr() != d2["w"].untyped_storage().data_ptr()
    assert hostreg.stats().registrations == 2

    # d1's writer is done: its buffer is reused, d2 (still alive) is left alone.
    ptr1 = d1["w"].untyped_storage().data_ptr()
    del d1
    want2 = snapshot({"w": d2["w"], "b": d2["n"]["b"]})
    d3 = stager.stage(sd3)
    assert stager.arenas_created == 2
    assert d3["w"].untyped_storage().data_ptr() == ptr1
    assert torch.equal(d2["w"], want2["w"]) and torch.equal(d2["n"]["b"], want2["b"])
    assert torch.equal(d3["w"], sd3["w"]) and d3["step"] == 3


def test_max_buffers_one_waits_then_raises():
    stager = ht.Stager(max_buffers=1, wait_timeout_s=0.3)
    try:
        sd1, sd2 = {"w": torch.ones(100)}, {"w": torch.full((100,), 2.0)}
        d1 = stager.stage(sd1)
        t0 = time.monotonic()
        with pytest.raises(hostreg.StagingError, match="max_buffers"):
            stager.stage(sd2)
        waited = time.monotonic() - t0
        assert 0.3 <= waited < 10, waited
        assert torch.equal(d1["w"], torch.ones(100)), "the busy buffer was overwritten"
        assert stager.arenas_created == 1
        del d1
        d2 = stager.stage(sd2)  # free again: reused, no new arena
        assert torch.equal(d2["w"], sd2["w"]) and stager.arenas_created == 1
        del d2
    finally:
        stager.close()


def test_close_releases_everything():
    gc.collect()
    regs0, locked0 = hostreg.stats().registrations, hostreg.locked_bytes()
    fds0 = shm_fds()
    stager = ht.Stager()
    d1 = stager.stage({"w": torch.randn(1 << 18), "b": torch.ones(3)})
    d2 = stager.stage({"w": torch.randn(1 << 18), "b": torch.ones(3)})
    assert hostreg.stats().registrations == regs0 + 2
    assert hostreg.locked_bytes() - locked0 >= 2 * (1 << 20)
    want = d1["w"].clone()
    stager.close()
    stager.close()  # idempotent
    assert hostreg.stats().registrations == regs0
    assert hostreg.locked_bytes() == locked0
    assert torch.equal(d1["w"], want), "tensors still held must stay valid after close()"
    with pytest.raises(hostreg.HostregError, match="after close"):  # the family, and a RuntimeError
        stager.stage({"w": torch.randn(1 << 18), "b": torch.ones(3)})
    del d1, d2
    gc.collect()
    assert shm_fds() == fds0, "shared-memory descriptors outlived the stager and its tensors"


def test_a_stager_as_a_context_manager_closes_on_leaving_also_on_an_exception():
    gc.collect()
    regs0, locked0 = hostreg.stats().registrations, hostreg.locked_bytes()
    with ht.Stager(async_staging=True) as stager:
        staged = stager.stage({"w": torch.ones(1 << 18)}).result()
        assert hostreg.stats().registrations == regs0 + 1 and hostreg.locked_bytes() - locked0 >= 1 << 20
    assert hostreg.stats().registrations == regs0 and hostreg.locked_bytes() == locked0
    assert torch.equal(staged["w"], torch.ones(1 << 18)), "tensors still held stay valid after the block"
    with pytest.raises(KeyError), ht.Stager() as second:
        second.stage({"w": torch.ones(1 << 18)})
        raise KeyError("the training loop failed")
    assert hostreg.stats().registrations == regs0 and hostreg.locked_bytes() == locked0
    with pytest.raises(RuntimeError, match="after close"):
        second.stage({"w": torch.ones(3)})


def test_hostreg_errors_are_one_family_importable_from_hostreg():
    from hostreg import HostregError, LastError, StagingError, Stats

    assert issubclass(StagingError, HostregError) and issubclass(HostregError, RuntimeError)
    assert isinstance(hostreg.stats(), Stats) and isinstance(hostreg.last_error(), LastError)
    with pytest.raises(HostregError, match="cannot stage"):  # a size no address space holds
        ht.Arena(1 << 64)


def test_stage_rejects_non_dict(stager):
    with pytest.raises(TypeError):
        stager.stage([torch.ones(3)])
    assert stager.arenas_created == 0


# ---- async staging ---------------------------------------------------------------------------


def test_async_staging_returns_a_future_and_round_trips(tmp_path):
    torch.manual_seed(0)
    model = Net()
    stager = ht.Stager(async_staging=True)
    try:
        sd = dict(model.state_dict())  # a dict, as async_save passes (the same structure: one arena)
        want = snapshot(sd)
        fut = stager.stage(sd)
        assert isinstance(fut, Future)
        staged = fut.result(timeout=60)
        mutate(model, 3)  # after the future resolved: the staged copy must not change
        assert_same(snapshot(staged), want)
        del staged, fut
        res = dcp.async_save(model.state_dict(), checkpoint_id=str(tmp_path / "a"), async_stager=stager, no_dist=True)
        assert isinstance(res, state_dict_saver.AsyncSaveResponse)
        want = snapshot(model.state_dict())
        res.staging_completion.result(timeout=60)
        mutate(model, 4)
        res.upload_completion.result(timeout=60)
        assert_same(load(tmp_path / "a", want), want)
        assert stager.arenas_created == 1
        stager.synchronize_staging()
    finally:
        stager.close()


def test_stager_takes_dcps_staging_options_where_default_stager_refuses_them(tmp_path):
    """``DefaultStager(StagingOptions(True, True, True, True))`` raises on a host without an
    accelerator (torch's non-blocking check); ``ht.Stager`` takes the same options there, and
    they mean what they say: async, shared, pinned (registered by hostreg)."""
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    opts = StagingOptions(True, True, True, True)
    if not torch.accelerator.is_available():
        with pytest.raises(AssertionError, match="accelerator"):
            DefaultStager(opts)
    torch.manual_seed(0)
    model = Net()
    with ht.Stager(opts) as stager:
        assert (stager.pin_memory, stager.share_memory, stager.async_staging) == (True, True, True)
        want = snapshot(model.state_dict())
        res = dcp.async_save(model.state_dict(), checkpoint_id=str(tmp_path), async_stager=stager, no_dist=True)
        res.staging_completion.result(timeout=60)
        assert hostreg.stats().registrations >= 1  # the arena is page-locked
        res.upload_completion.result(timeout=60)
        assert_same(load(tmp_path, want), want)
    with ht.Stager(StagingOptions(False, False, False, False)) as stager:
        assert (stager.pin_memory, stager.share_memory, stager.async_staging) == (False, False, False)
    with pytest.raises(TypeError, match="not both"):
        ht.Stager(opts, pin_memory=False)
    with pytest.raises(TypeError, match="StagingOptions, not dict"):
        ht.Stager({"use_pinned_memory": True})
    for bad in ({"pin_memory": 0}, {"share_memory": "yes"}, {"max_buffers": 1.5}, {"max_buffers": True}):
        with pytest.raises(TypeError):
            ht.Stager(**bad)
    for bad_timeout in (float("nan"), float("inf"), -1):
        with pytest.raises(ValueError, match="wait_timeout_s"):
            ht.Stager(wait_timeout_s=bad_timeout)


def test_async_stage_refuses_what_it_can_know_at_once(tmp_path):
    """torch's async_save takes a staging future that is already done for a success whatever it
    holds: an unsupported tensor must raise from stage() (and so from async_save), not land on
    a future that fails before async_save looks at it."""
    stager = ht.Stager(async_staging=True)
    q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    try:
        with pytest.raises(TypeError, match=r"^q: .*quantized"):
            stager.stage({"w": torch.ones(2), "q": q})
        with pytest.raises(TypeError, match="quantized"):
            dcp.async_save({"q": q}, checkpoint_id=str(tmp_path / "a"), async_stager=stager, no_dist=True)
        assert not os.path.exists(tmp_path / "a" / ".metadata")
        assert stager.arenas_created == 0
        stager.synchronize_staging()  # nothing was submitted
        ok = stager.stage({"w": torch.ones(5)}).result(timeout=60)  # the stager still works
        assert torch.equal(ok["w"], torch.ones(5))
        del ok
    finally:
        stager.close()


def test_async_stage_refuses_a_first_arena_without_room(tmp_path):
    """Under RLIMIT_MEMLOCK of 8 MiB without CAP_IPC_LOCK (posix backend): the first arena of
    16 MiB cannot be locked; stage() and async_save raise StagingError with the limit's words,
    nothing is submitted, nothing stays locked. A later arena's failure (after a change of
    structure) is set on the future instead, and async_save's upload_completion shows it."""
    from conftest import low_memlock, run_python

    code = f"""
import torch, torch.distributed.checkpoint as dcp, hostreg, hostreg.torch as ht
st = ht.Stager(async_staging=True)
big = {{"w": torch.ones(4 << 20)}}  # 16 MiB
for how in ("stage", "async_save"):
    try:
        if how == "stage":
            st.stage(big)
        else:
            dcp.async_save(big, checkpoint_id={str(tmp_path / "c")!r}, async_stager=st, no_dist=True)
        print(how, "returned")
    except hostreg.StagingError as e:
        print(how, "StagingError", "RLIMIT_MEMLOCK" in str(e), st.arenas_created, hostreg.locked_bytes())
small = st.stage({{"w": torch.ones(1024)}}).result(timeout=60)  # fits: the first arena
del small
fut = st.stage({{"w2": torch.ones(4 << 20)}})  # a new structure: its room is the worker's to find
try:
    fut.result(timeout=60)
    print("later returned")
except hostreg.StagingError as e:
    print("later StagingError on the future", "RLIMIT_MEMLOCK" in str(e))
st.close()
print("locked after close", hostreg.locked_bytes())
"""
    r = run_python(code, *low_memlock(), env={"HOSTREG_BACKEND": "posix", "HOSTREG_LOG_LEVEL": "off"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "stage StagingError True 0 0" in lines, r.stdout
    assert "async_save StagingError True 0 0" in lines, r.stdout
    assert "later StagingError on the future True" in lines, r.stdout
    assert "locked after close 0" in lines, r.stdout


def test_async_close_waits_for_staging_in_progress():
    stager = ht.Stager(async_staging=True)
    futs = [stager.stage({"w": torch.full((1 << 16,), float(i))}) for i in range(2)]
    stager.close()  # lets what was submitted finish, then releases the arenas
    for i, f in enumerate(futs):
        assert torch.equal(f.result(timeout=0)["w"], torch.full((1 << 16,), float(i)))
    assert hostreg.stats().registrations == 0
    with pytest.raises(RuntimeError, match="after close"):
        stager.stage({"w": torch.ones(3)})
    del futs
    gc.collect()


def test_close_ends_a_staging_waiting_for_a_buffer():
    stager = ht.Stager(async_staging=True, max_buffers=1)
    held = stager.stage({"w": torch.ones(8)}).result(timeout=60)  # its buffer stays busy
    waiting = stager.stage({"w": torch.zeros(8)})
    time.sleep(0.3)
    assert not waiting.done()
    t0 = time.monotonic()
    stager.close()
    assert time.monotonic() - t0 < 10
    with pytest.raises(RuntimeError, match="waited for a free buffer"):
        waiting.result(timeout=0)
    assert torch.equal(held["w"], torch.ones(8))
    del held
    gc.collect()


def _busy_stager() -> tuple[ht.Stager, dict]:
    """An async stager with one buffer, held busy by a staged dict the caller keeps: the next
    stage() waits on the worker for that buffer."""
    stager = ht.Stager(async_staging=True, max_buffers=1, wait_timeout_s=30)
    held = stager.stage({"w": torch.ones(1 << 16)}).result(timeout=60)
    return stager, held


def test_async_stage_returns_at_once_while_the_worker_waits_for_a_buffer():
    stager, held = _busy_stager()
    try:
        waiting = stager.stage({"w": torch.zeros(1 << 16)})  # the worker now waits for the buffer
        time.sleep(0.2)
        assert not waiting.done()
        t0 = time.monotonic()
        queued = stager.stage({"w": torch.full((1 << 16,), 2.0)})
        blocked = time.monotonic() - t0
        # The worker holds the buffers for up to wait_timeout_s (30 s); stage() must not wait for it.
        assert blocked < 1.0, f"stage() blocked {blocked:.2f} s behind the worker"
        del held
        gc.collect()
        assert torch.equal(waiting.result(timeout=60)["w"], torch.zeros(1 << 16))
    finally:
        stager.close()
    with pytest.raises(RuntimeError):  # its buffer stayed busy (waiting's result) until close()
        queued.result(timeout=60)


def test_a_cancelled_stage_is_never_staged_and_synchronize_raises_cancelled():
    from concurrent.futures import CancelledError

    stager, held = _busy_stager()
    try:
        waiting = stager.stage({"w": torch.zeros(1 << 16)})
        queued = stager.stage({"w": torch.full((1 << 16,), 3.0)})
        assert queued.cancel(), "still queued behind the waiting one"
        got: list = []
        t = threading.Thread(target=lambda: got.append(_raises(stager.synchronize_staging)), daemon=True)
        t.start()
        t.join(timeout=30)
        assert not t.is_alive(), "synchronize_staging() hung on a cancelled stage"
        assert got and isinstance(got[0], CancelledError)
        del held
        gc.collect()
        waiting.result(timeout=60)
        assert stager.arenas_created == 1
    finally:
        stager.close()


def _raises(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as e:  # noqa: BLE001 -- the test looks at which
        return e
    return None


def test_close_from_a_done_callback_on_the_staging_thread():
    stager, held = _busy_stager()
    errors: list = []
    where: list = []

    def close_now(_f: Future) -> None:
        where.append(threading.current_thread().name)
        errors.append(_raises(stager.close))

    try:
        fut = stager.stage({"w": torch.zeros(1 << 16)})
        fut.add_done_callback(close_now)  # runs on the worker: the future is not done yet
        del held
        gc.collect()
        fut.result(timeout=60)
        deadline = time.monotonic() + 30
        while not errors and time.monotonic() < deadline:
            time.sleep(0.01)
        assert where and where[0].startswith("hostreg-stager")
        assert errors == [None], errors
        assert hostreg.stats().registrations == 0, "close() released the arena"
        with pytest.raises(RuntimeError, match="after close"):
            stager.stage({"w": torch.ones(3)})
    finally:
        stager.close()  # again, from the caller: idempotent
    del fut
    gc.collect()


def test_async_staging_without_a_thread_raises_staging_error(monkeypatch):
    def refuse(self):
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as m:
        m.setattr(threading.Thread, "start", refuse)
        with pytest.raises(hostreg.StagingError, match="staging thread"):
            ht.Stager(async_staging=True)
    assert not [t for t in threading.enumerate() if t.name.startswith("hostreg-stager")]
    stager = ht.Stager(async_staging=True)  # threads again: works
    try:
        staged = stager.stage({"w": torch.full((3,), 2.0)}).result(timeout=60)
        assert torch.equal(staged["w"], torch.full((3,), 2.0)) and stager.arenas_created == 1
        del staged
    finally:
        stager.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("hostreg-stager")], "close() left the thread"


# ---- DCP's own stager through the drop-in -------------------------------------------------------


@pytest.fixture
def ascend_state(monkeypatch):
    """What torch_npu's ``transfer_to_npu`` leaves a CPU build of torch with:
    ``torch.cuda.cudart()`` returns None; with hostreg's drop-in installed. (Its other half,
    ``torch.cuda.is_available()`` True, each test sets while it makes the stager: with it set,
    DCP's writer would use the device's streams, which a CPU stand-in does not have.)"""
    ht.uninstall()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: None)
    ht.install()
    yield
    gc.collect()  # PyTorch's finalizers unpin through torch.cuda.cudart(): while installed
    ht.uninstall()


@pytest.mark.parametrize("options", ["StagingOptions(True, True, False, False)", "StagingOptions()"])
def test_default_stager_pins_through_the_dropin(ascend_state, options, monkeypatch, tmp_path):
    staging = pytest.importorskip("torch.distributed.checkpoint.staging")
    if not hasattr(staging, "DefaultStager"):
        pytest.skip("this torch has no DefaultStager")
    opts = eval(options, {"StagingOptions": staging.StagingOptions})
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)  # the NPU's answer under transfer_to_npu
        if options == "StagingOptions()":
            # Async staging with non-blocking copies wants an accelerator; the NPU's stand-in is
            # the CPU (a CPU stream, copies that are plain copies). The pinning is real.
            m.setattr(torch.accelerator, "is_available", lambda: True)
        stager = staging.DefaultStager(opts)
    torch.manual_seed(0)
    model = Net()
    want = snapshot(model.state_dict())
    gc.collect()
    regs0, locked0 = hostreg.stats().registrations, hostreg.locked_bytes()
    try:
        staged = stager.stage(model.state_dict())
        if isinstance(staged, Future):
            staged = staged.result(timeout=60)
        assert_same(snapshot(staged), want)
        pinned = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in staged.values()
            if t.untyped_storage().nbytes() >= 5
        }  # StateDictStager pins storages of >= 5 bytes
        assert pinned and all(hostreg.registration(p) is not None for p in pinned), "a storage was not registered"
        assert hostreg.stats().registrations - regs0 == len(pinned)
        assert hostreg.locked_bytes() - locked0 >= sum(pinned.values()), "VmLck did not rise: nothing locked"
        del staged
        res = dcp.async_save(model.state_dict(), checkpoint_id=str(tmp_path / "d"), async_stager=stager, no_dist=True)
        (res.upload_completion if hasattr(res, "upload_completion") else res).result(timeout=120)
        del res
        assert_same(load(tmp_path / "d", want), want)
    finally:
        stager.close()
    del stager  # its last staging future keeps that staged dict (pinned) even after close()
    torch_save_threads_joined()
    gc.collect()
    assert hostreg.stats().registrations == regs0 and hostreg.locked_bytes() == locked0


# ---- two ranks over gloo -----------------------------------------------------------------


def rank_state_dict(rank: int) -> dict:
    torch.manual_seed(0)  # replicated entries equal on every rank, as DCP expects
    model = Net()
    return {"model": model.state_dict(), f"rank{rank}": torch.full((5,), float(rank) + 0.5)}


def load_rank(path: str, like: dict) -> dict:
    out = {
        "model": {k: torch.full_like(v, 7) for k, v in like["model"].items()},
        **{k: torch.zeros_like(v) for k, v in like.items() if k != "model"},
    }
    dcp.load(out, checkpoint_id=path)
    return out


def assert_rank_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    assert_same(a["model"], b["model"])
    for k in a:
        if k != "model":
            assert torch.equal(a[k], b[k]), k


def _rank_main(rank: int, world: int, path: str, mode: str) -> None:
    stager = ht.Stager()
    sd = rank_state_dict(rank)
    want = {"model": snapshot(sd["model"]), **{k: v.clone() for k, v in sd.items() if k != "model"}}
    if mode == "thread":
        for i in range(3):
            dcp.async_save(sd, checkpoint_id=f"{path}/t{i}", async_stager=stager).result(timeout=120)
        assert stager.arenas_created == 1 and hostreg.stats().registrations == 1
        assert_rank_same(load_rank(f"{path}/t2", sd), want)
    else:
        kind = state_dict_saver.AsyncCheckpointerType.PROCESS
        res = dcp.async_save(sd, checkpoint_id=f"{path}/p", async_stager=stager, async_checkpointer_type=kind)
        res.result(timeout=120)
        from torch.distributed.checkpoint import _async_process_executor as ape

        assert ape._CHECKPOINT_PROCESS is not None, "the background-process checkpointer did not run"
        assert ape._CHECKPOINT_PROCESS._save_process.pid != os.getpid()
        assert stager.arenas_created == 1 and hostreg.stats().registrations == 1
        assert_rank_same(load_rank(f"{path}/p", sd), want)
    stager.close()
    assert hostreg.stats().registrations == 0 and hostreg.locked_bytes() == 0


def test_two_ranks_async_save_and_load(tmp_path):
    run_ranks(_rank_main, (str(tmp_path), "thread"), timeout=180)


@pytest.mark.skipif(
    not hasattr(getattr(state_dict_saver, "AsyncCheckpointerType", None), "PROCESS"),
    reason="this torch has no AsyncCheckpointerType.PROCESS",
)
def test_two_ranks_background_process_checkpointer(tmp_path):
    run_ranks(_rank_main, (str(tmp_path), "process"), timeout=180)


def test_a_source_freed_before_async_staging_copies_fails_on_the_future():
    # DCP's DefaultStager survives this; so must hostreg's (it segfaulted: a copy from freed memory).
    stager, held = _busy_stager()
    try:
        src = {"w": torch.full((1 << 16,), 5.0)}
        fut = stager.stage(src)  # waits on the worker for the busy buffer
        src["w"].untyped_storage().resize_(0)  # freed while it waits
        del held
        gc.collect()
        with pytest.raises(hostreg.StagingError, match="fewer than the 262,144 its view reads"):
            fut.result(timeout=60)
        ok = stager.stage({"w": torch.ones(1 << 16)}).result(timeout=60)  # the stager still works
        assert torch.equal(ok["w"], torch.ones(1 << 16))
        del ok
    finally:
        stager.close()
