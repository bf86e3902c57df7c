"""In-place pinning (hostreg.torch.pin_, unpin_, pinned) and Tensor.is_pinned()'s answer for
memory hostreg registered. Locks are proven by the kernel's own count (VmLck) and the
registry; the drop-in is installed in a fresh interpreter where a test needs it."""

from __future__ import annotations

import gc
import json
import mmap

import numpy as np
import pytest
import torch

import hostreg
import hostreg.torch as ht
from conftest import run_python

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
    else:  # a view into the middle of a larger storage: the whole storage is pinned
        t = torch.arange(2 * n, dtype=torch.float32)[n // 2 : n // 2 + n]
    want = t.detach().clone()
    storage = t.untyped_storage()
    ptr, nbytes, data_ptr = storage.data_ptr(), storage.nbytes(), t.data_ptr()
    locked0 = hostreg.locked_bytes()
    assert ht.pin_(t) is t
    assert t.data_ptr() == data_ptr and torch.equal(t.detach(), want), "pinned in place: no byte moved"
    reg = hostreg.registration(ptr)
    assert reg is not None and (reg.base, reg.nbytes) == (ptr, nbytes)
    assert hostreg.locked_bytes() - locked0 >= whole_pages(nbytes) - PAGE  # the kernel's count (posix)
    assert ht.is_pinned_by_hostreg(t) and ht.is_pinned_by_hostreg(t[5:])
    with torch.no_grad():
        t.add_(1)  # still an ordinary tensor
    assert torch.equal(t.detach(), want + 1)
    del t, storage
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
    with ht.pinned(a, b, a[5:]):  # a and its view share a storage: pinned once
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
    assert got["after"] == {"plain": False, "pin_": True, "view": True, "arena": True, "torch_path": True, "shared": True}
    # uninstall() gives torch its own is_pinned back.
    assert got["restored"] == [False, False]
