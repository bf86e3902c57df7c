"""In-place pinning (hostreg.torch.pin_, unpin_, pinned) and Tensor.is_pinned()'s answer for
memory hostreg registered. Locks are proven by the kernel's own count (VmLck) and the
registry; the drop-in is installed in a fresh interpreter where a test needs it."""

from __future__ import annotations

import gc
import json
import mmap
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import run_python

import hostreg
import hostreg.torch as ht

PAGE = mmap.PAGESIZE


def whole_pages(nbytes: int) -> int:
    return -(-nbytes // PAGE) * PAGE


@pytest.mark.parametrize("kind", ["torch", "numpy", "from_file", "shared", "parameter", "view"])
def test_pin_locks_the_storage_in_place_and_its_release_unlocks_it(kind: str, tmp_path):
    n = 1 << 18  # 1 MiB of float32
    if kind == "torch":
        t = torch.arange(n, dtype=torch.float32)
    elif kind == "numpy":
        t = torch.from_numpy(np.arange(n, dtype=np.float32))
    elif kind == "from_file":
        path = tmp_path / "f"
        path.write_bytes(np.arange(n, dtype=np.float32).tobytes())
        t = torch.from_file(str(path), shared=True, size=n, dtype=torch.float32)
    elif kind == "shared":
        t = torch.arange(n, dtype=torch.float32).share_memory_()
    elif kind == "parameter":
        t = torch.nn.Parameter(torch.arange(n, dtype=torch.float32))
    else:  # a tensor in the middle of a larger storage, alone on it: the whole storage is pinned
        t = torch.arange(2 * n, dtype=torch.float32)[n // 2 : n // 2 + n].detach()
    want = t.detach().clone()
    ptr, nbytes, data_ptr = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), t.data_ptr()
    locked0 = hostreg.locked_bytes()
    if kind in ("from_file", "shared"):
        with pytest.warns(RuntimeWarning, match="sending the tensor to another process"):
            assert ht.pin_(t) is t
    else:
        assert ht.pin_(t) is t
    assert t.data_ptr() == data_ptr and torch.equal(t.detach(), want), "pinned in place: no byte moved"
    reg = hostreg.registration(ptr)
    assert reg is not None and (reg.base, reg.nbytes) == (ptr, nbytes)
    assert hostreg.locked_bytes() - locked0 >= whole_pages(nbytes) - PAGE  # the kernel's count (posix)
    assert ht.is_pinned_by_hostreg(t) and ht.is_pinned_by_hostreg(t[5:])
    with torch.no_grad():
        t.add_(1)  # still an ordinary tensor
    assert torch.equal(t.detach(), want + 1)
    del t
    gc.collect()
    assert hostreg.registration(ptr) is None and hostreg.locked_bytes() == locked0, "freeing the tensor unregisters"


def test_a_freed_storage_is_unregistered_before_its_memory_can_be_reused():
    # Large CPU allocations are mmap'ed and unmapped on free, so the next one of the same size
    # often gets the same address: a registration left behind would answer 712 there.
    n = 4 << 20
    addresses = set()
    for _ in range(20):
        t = torch.empty(n, dtype=torch.uint8)
        ht.pin_(t)  # raises PinError 712 if the last one's registration outlived its memory
        addresses.add(t.data_ptr())
        del t
    assert hostreg.stats().registrations == 0
    assert len(addresses) < 20, "the allocator never reused an address: this test proved nothing"


def test_pin_twice_answers_712_and_unpin_twice_713():
    t = torch.zeros(4096)
    ht.pin_(t)
    with pytest.raises(ht.PinError) as e:
        ht.pin_(t[100:])  # any byte registered: CUDA's cudaHostRegister answers 712
    assert e.value.code == hostreg.cudaError.cudaErrorHostMemoryAlreadyRegistered
    assert isinstance(e.value, hostreg.HostregError)
    ht.unpin_(t)
    assert not ht.is_pinned_by_hostreg(t) and torch.equal(t, torch.zeros(4096)), "unpinned, the bytes stay"
    with pytest.raises(ht.PinError) as e:
        ht.unpin_(t)
    assert e.value.code == hostreg.cudaError.cudaErrorHostMemoryNotRegistered
    with pytest.raises(ht.PinError) as e:
        ht.unpin_(torch.ones(3))  # never pinned
    assert e.value.code == 713


def test_pinned_unpins_on_leaving_and_rolls_back_when_one_fails():
    a, b = torch.zeros(10_000), torch.ones(10_000)
    with ht.pinned(a, b, a):  # the same storage twice: pinned once
        assert ht.is_pinned_by_hostreg(a) and ht.is_pinned_by_hostreg(b)
        assert hostreg.stats().registrations == 2
    assert hostreg.stats().registrations == 0
    c = torch.zeros(10_000)
    ht.pin_(c)
    with pytest.raises(ht.PinError), ht.pinned(a, c):  # c is pinned already: a is unpinned again
        pass
    assert not ht.is_pinned_by_hostreg(a) and ht.is_pinned_by_hostreg(c)
    with pytest.raises(KeyError), ht.pinned(a):
        raise KeyError("the block failed")
    assert not ht.is_pinned_by_hostreg(a)
    ht.unpin_(c)


@pytest.mark.parametrize(
    "make, error, words",
    [
        (lambda: torch.zeros(3, device="meta"), ValueError, "on meta"),
        (lambda: torch.zeros(3).to_sparse(), TypeError, "strided"),
        (lambda: [1, 2], TypeError, "not list"),
    ],
    ids=["meta", "sparse", "list"],
)
def test_pin_refuses_what_it_cannot_lock(make, error, words):
    with pytest.raises(error, match=words):
        ht.pin_(make())
    assert hostreg.stats().registrations == 0


def test_pin_refuses_storages_others_could_free_or_move_under_it():
    # A view made before pin_ keeps the original storage: resize_(0) or share_memory_() on it
    # would free the memory while it is registered. Refused, naming the fix.
    base = torch.zeros(1 << 16)
    early = base[10:]
    with pytest.raises(ValueError, match="pin the tensor before making views"):
        ht.pin_(base)
    p = torch.nn.Parameter(torch.zeros(1 << 16))
    with pytest.raises(ValueError, match="other tensor"):
        ht.pin_(p.data)  # a second tensor over p's storage: p could move it
    with pytest.raises(ValueError, match="base of a view"):
        ht.pin_(torch.zeros(100)[10:])
    m = torch.nn.Linear(64, 64)
    with pytest.raises(ValueError, match=r"pin the owner instead \(the parameter"):
        ht.pin_(m.state_dict()["weight"])  # shares m.weight's storage: the error says to pin m.weight
    for t in (*m.parameters(), *m.buffers()):
        ht.pin_(t)  # what it says, after which state_dict() gives pinned tensors
    assert all(ht.is_pinned_by_hostreg(t) for t in m.state_dict().values())
    for t in m.parameters():
        ht.unpin_(t)
    del m
    kept = torch.zeros(1 << 16)
    s = kept.untyped_storage()  # s.resize_(0) would free the memory under the registration
    with pytest.raises(ValueError, match="storage object of this tensor is held elsewhere"):
        ht.pin_(kept)
    del s
    assert hostreg.stats().registrations == 0
    del early
    gc.collect()
    ht.pin_(base)  # alone now
    late = base[10:]  # views made after share the pinned storage, which cannot be resized
    with pytest.raises(RuntimeError):
        late.untyped_storage().resize_(0)
    assert ht.is_pinned_by_hostreg(late)
    ht.unpin_(base)


def test_a_collection_inside_pin_that_frees_another_pinned_tensor_does_not_deadlock():
    # The garbage collector may run inside pin_ (at any allocation) and free another pinned
    # tensor there, on the same thread: here every collection frees one (a gc callback), and
    # collections come at nearly every allocation.
    import threading

    victims = [ht.pin_(torch.zeros(256)) for _ in range(400)]

    def free_one(phase: str, info: dict) -> None:
        if phase == "start" and victims:
            victims.pop()

    def run() -> None:
        for _ in range(100):
            ht.pin_(torch.zeros(256))

    worker = threading.Thread(target=run, daemon=True)
    old = gc.get_threshold()
    gc.callbacks.append(free_one)
    gc.set_threshold(1, 1, 1)
    try:
        worker.start()
        worker.join(timeout=60)
    finally:
        gc.set_threshold(*old)
        gc.callbacks.remove(free_one)
    assert not worker.is_alive(), "pin_ deadlocked against a collection freeing a pinned tensor"
    assert len(victims) < 400, "no collection freed a pinned tensor: this run proved nothing"
    victims.clear()
    gc.collect()
    assert hostreg.stats().registrations == 0


INTERRUPTED = r"""
import sys, gc, torch, hostreg, hostreg.torch as ht
from hostreg.torch import _pin
lines = [int(x) for x in sys.argv[1:]]
code = _pin.pin_.__code__
gc.collect(); gc.freeze()  # each collection below then scans only what the runs make
for target in lines:
    def tracer(frame, event, arg, target=target):
        if frame.f_code is code and event == "line" and frame.f_lineno == target:
            sys.settrace(None)
            raise KeyboardInterrupt
        return tracer
    t = torch.zeros(1 << 12)
    sys.settrace(lambda f, e, a: tracer if f.f_code is code else None)
    try:
        ht.pin_(t)
    except KeyboardInterrupt:
        pass
    sys.settrace(None)
    del t
    gc.collect()
    if hostreg.stats().registrations:
        print("LEFT", target, hostreg.registrations()); sys.exit(1)
print("OK", len(lines))
"""


def test_an_interrupt_at_any_line_of_pin_leaves_nothing_registered():
    import inspect

    from hostreg.torch import _pin

    lines, first = inspect.getsourcelines(_pin.pin_)
    numbers = [first + i for i, text in enumerate(lines) if text.strip() and not text.strip().startswith(("#", '"'))]
    r = subprocess.run(
        [sys.executable, "-c", INTERRUPTED, *map(str, numbers)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr[-3000:]


REAL_SIGNALS = r"""
import gc, signal, sys, torch, hostreg, hostreg.torch as ht
armed = False


def interrupt(*_):  # a KeyboardInterrupt wherever the body is when the alarm lands, once per arming
    global armed
    if armed:
        armed = False
        raise KeyboardInterrupt


signal.signal(signal.SIGALRM, interrupt)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)  # every 0.2 ms
interrupts = refused = 0
for i in range(int(sys.argv[1])):
    try:
        armed = True
        t = torch.empty(1 << 12, dtype=torch.uint8)
        ht.pin_(t)
        if i % 2:
            ht.unpin_(t)
        del t
        armed = False
    except KeyboardInterrupt:
        interrupts += 1
    except ht.PinError:  # 712 on fresh memory: a registration outlived its memory
        armed = False
        refused += 1
signal.setitimer(signal.ITIMER_REAL, 0)
t = None
gc.collect()
print(interrupts, refused, hostreg.stats().registrations)
"""


def test_real_interrupts_around_pins_never_leave_freed_memory_registered():
    r = subprocess.run([sys.executable, "-c", REAL_SIGNALS, "4000"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    interrupts, refused, left = map(int, r.stdout.split())
    assert interrupts > 20, "the signals never landed: this run proved nothing"
    assert (refused, left) == (0, 0), (interrupts, refused, left, r.stderr[-2000:])


def test_pin_of_an_empty_tensor_locks_nothing():
    t = torch.empty(0)
    assert ht.pin_(t) is t and hostreg.stats().registrations == 0
    assert ht.unpin_(t) is t


def test_pin_under_a_memlock_limit_says_why():
    code = (
        "import json, torch, hostreg.torch as ht\n"
        "t = torch.empty(64 << 20, dtype=torch.uint8)\n"
        "try:\n"
        "    ht.pin_(t)\n"
        "except ht.PinError as e:\n"
        "    print(json.dumps([int(e.code), str(e)]))\n"
    )
    from conftest import low_memlock

    r = run_python(code, *low_memlock(8192), env={"HOSTREG_BACKEND": "posix"})
    assert r.returncode == 0, r.stderr
    code_, message = json.loads(r.stdout)
    assert code_ == 2 and "RLIMIT_MEMLOCK" in message


IS_PINNED = r"""
import json, torch, hostreg.torch as ht
from torch.distributed._state_dict_utils import _create_cpu_state_dict
plain, pinned_here = torch.zeros(1000), torch.zeros(1000)
before = [plain.is_pinned(), pinned_here.is_pinned()]
ht.install()
ht.pin_(pinned_here)
staged = ht.create_cpu_state_dict({"w": torch.ones(1000)})
theirs = _create_cpu_state_dict({"w": torch.ones(1000)}, share_memory=True, pin_memory=True)
after = {"plain": plain.is_pinned(), "pin_": pinned_here.is_pinned(), "view": pinned_here[10:].is_pinned(),
         "arena": staged["w"].is_pinned(), "torch_path": theirs["w"].is_pinned(), "shared": theirs["w"].is_shared()}
ht.uninstall()
del staged, theirs
restored = [pinned_here.is_pinned(), "is_pinned" in torch.Tensor.__dict__]
print(json.dumps({"before": before, "after": after, "restored": restored}))
"""


def test_is_pinned_tells_the_truth_about_hostregs_memory_after_install():
    r = run_python(IS_PINNED, env={"HOSTREG_BACKEND": "posix"})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    # A CPU build of torch says False for memory it did not allocate pinned, even when locked.
    assert got["before"] == [False, False]
    # After install(): True where the bytes lie in a live hostreg registration (as CUDA answers
    # for memory cudaHostRegister registered; PyTorch's own stager tests assert it), torch's
    # own answer elsewhere.
    assert got["after"] == {
        "plain": False,
        "pin_": True,
        "view": True,
        "arena": True,
        "torch_path": True,
        "shared": True,
    }
    # uninstall() gives torch its own is_pinned back.
    assert got["restored"] == [False, False]
