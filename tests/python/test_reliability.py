"""Hostile environments and lifecycles: limits created by the tests themselves (prlimit,
setpriv), fork, repeated create/release, and what the shared memory looks like."""

from __future__ import annotations

import gc
import glob
import os
import stat
import textwrap

import torch
from conftest import low_memlock, run_python

import hostreg
import hostreg.torch as ht


def shm_fds() -> int:
    return sum(1 for p in glob.glob("/proc/self/fd/*") if os.path.exists(p) and "/dev/shm" in os.readlink(p))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGESIZE")


MANY_SMALL = textwrap.dedent(
    """
    import sys, torch, hostreg, hostreg.torch as ht
    from torch.distributed._state_dict_utils import _create_cpu_state_dict, _copy_state_dict
    sd = {f"t{i}": torch.full((1024,), float(i)) for i in range(5000)}
    try:
        if sys.argv[1] == "hostreg":
            st = ht.create_cpu_state_dict(sd); ht.copy_state_dict(sd, st)
        else:
            ht.install(); st = _create_cpu_state_dict(sd, share_memory=True, pin_memory=True); _copy_state_dict(sd, st)
        print("ok", all(torch.equal(sd[k], st[k]) for k in sd), hostreg.stats().registrations)
    except Exception as e:
        print("failed:", e)
    """
)


def test_5000_tensors_under_an_open_file_limit_of_1024():
    # hostreg's arena is one shared-memory object (one descriptor); PyTorch's path needs one
    # per tensor and runs out (PyTorch #11201, #60626).
    limit = ("prlimit", "--nofile=1024:1024", "--")
    r = run_python(MANY_SMALL.replace("sys.argv[1]", "'hostreg'"), *limit)
    assert r.returncode == 0 and r.stdout.split() == ["ok", "True", "1"], r.stdout + r.stderr
    r = run_python(MANY_SMALL.replace("sys.argv[1]", "'torch'"), *limit)
    assert "Too many open files" in r.stdout  # what PyTorch 2.13's own path does there


def test_memlock_limit_answers_2_naming_ulimit():
    code = "import mmap, ctypes, hostreg; m = mmap.mmap(-1, 64 << 20); a = ctypes.addressof(ctypes.c_char.from_buffer(m)); print(int(hostreg.host_register(a, 64 << 20)), hostreg.stats().registrations, hostreg.locked_bytes()); print(hostreg.last_error().message)"
    r = run_python(code, *low_memlock(8192))
    first, message = r.stdout.splitlines()
    assert first == "2 0 0"
    assert "RLIMIT_MEMLOCK (8192 KiB, see `ulimit -l`)" in message and "CAP_IPC_LOCK" in message


FORK_CHILD = textwrap.dedent(
    """
    import gc, sys, torch, torch.multiprocessing as mp, hostreg, hostreg.torch as ht
    from torch.distributed._state_dict_utils import _create_cpu_state_dict, _copy_state_dict

    def child(q):
        # Inherited: the parent's staged copies and their finalizers; not inherited: locks.
        seen = (hostreg.stats().registrations, hostreg.locked_bytes())
        global torch_copy, arena_copy
        del torch_copy, arena_copy
        gc.collect()  # PyTorch's and hostreg's finalizers run here, in the child
        q.put((seen, hostreg.stats().registrations, hostreg.locked_bytes()))

    if __name__ == "__main__":
        ht.install()
        sd = {f"w{i}": torch.randn(1000 + i) for i in range(8)}
        torch_copy = _create_cpu_state_dict(sd, pin_memory=True, share_memory=True)
        _copy_state_dict(sd, torch_copy)
        arena_copy = ht.create_cpu_state_dict(sd)
        ht.copy_state_dict(sd, arena_copy)
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        print(q.get(timeout=60))
        p.join(60)
        print(p.exitcode, hostreg.stats().registrations)
    """
)


def test_fork_child_sees_no_registration_and_its_finalizers_succeed(tmp_path):
    script = tmp_path / "fork_child.py"
    script.write_text(FORK_CHILD)
    r = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    child, parent = r.stdout.splitlines()
    assert child == "((0, 0), 0, 0)"  # nothing inherited, nothing left, no error printed
    assert parent == "0 9"  # the parent's 8 + 1 registrations are untouched


def test_1000_create_release_cycles_leave_nothing():
    sd = {f"t{i}": torch.randn(256) for i in range(16)}
    locked0, fds0 = hostreg.locked_bytes(), shm_fds()

    def cycle() -> None:
        staged = ht.create_cpu_state_dict(sd)
        ht.copy_state_dict(sd, staged)
        assert hostreg.stats().registrations == 1
        del staged  # reference counting frees it at once: no gc.collect() needed
        assert hostreg.stats().registrations == 0

    for _ in range(50):  # warm-up: allocator caches, torch's lazy state
        cycle()
    rss0 = rss_bytes()
    for _ in range(1000):
        cycle()
    assert hostreg.stats().registrations == 0
    assert hostreg.locked_bytes() == locked0
    assert shm_fds() == fds0
    assert rss_bytes() - rss0 < 8 << 20, f"RSS grew by {(rss_bytes() - rss0) >> 20} MiB over 1000 cycles"


def test_staging_memory_has_no_name_and_is_owner_only():
    staged = ht.create_cpu_state_dict({"w": torch.ones(1000)})
    links = [os.readlink(p) for p in glob.glob("/proc/self/fd/*") if os.path.exists(p) and "/dev/shm" in os.readlink(p)]
    assert links and all(link.startswith("/dev/shm/#") and link.endswith("(deleted)") for link in links), links
    assert not os.listdir("/dev/shm") or all(not n.startswith("hostreg") for n in os.listdir("/dev/shm"))
    fd_paths = [p for p in glob.glob("/proc/self/fd/*") if os.path.exists(p) and "/dev/shm/#" in os.readlink(p)]
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in fd_paths)
    del staged
    gc.collect()


def test_arena_chunks_never_share_a_page():
    # Where a runtime caps one registration, an arena is several registrations whose
    # boundaries fall on pages; together they cover the whole arena, from its first byte.
    from hostreg.torch._state_dict import Arena

    page = os.sysconf("SC_PAGESIZE")
    a = Arena(10 * page + 123, share=False, max_chunk_bytes=4 * page)
    try:
        regs = hostreg.registrations()
        assert a.chunks == len(regs) >= 3
        spans = [(r.base // page, (r.base + r.nbytes - 1) // page) for r in regs]
        assert all(prev_last < first for (_, prev_last), (first, _) in zip(spans, spans[1:]))
        assert regs[0].base == a.data_ptr and a.data_ptr % page == 0
        assert sum(r.nbytes for r in regs) == a.buffer.size == a.nbytes
    finally:
        a.close()
    assert hostreg.stats().registrations == 0
