"""Interruption, refused resources and odd memory: after every failure nothing is left behind
(no registration, no lock, no /dev/shm descriptor), the process never aborts, and the error
names the cause. Each test here reproduces one way hostreg once broke; each runs in a fresh
interpreter where it changes limits, users, mounts or the working directory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import run_python, table_row

HOSTREG = str(Path(sys.executable).parent / "hostreg")

# What every child script prints last: what is left behind in it.
LEFT = textwrap.dedent(
    """
    import gc, glob, os, hostreg
    def left():
        gc.collect()
        shm = [p for p in glob.glob("/proc/self/fd/*") if os.path.exists(p) and "#" in os.readlink(p) and "(deleted)" in os.readlink(p)]
        return f"registrations={hostreg.stats().registrations} locked={hostreg.locked_bytes()} shm_fds={len(shm)}"
    def interrupt_at_line(k, exc=KeyboardInterrupt):
        # From now on, raise exc at the k-th line event inside hostreg's Python code.
        import sys
        seen = [0]
        def tracer(frame, event, arg):
            if "hostreg" not in frame.f_code.co_filename:
                return None
            if event == "line":
                seen[0] += 1
                if seen[0] == k:
                    raise exc()
            return tracer
        sys.settrace(tracer)
    """
)
NOTHING = "registrations=0 locked=0 shm_fds=0"


def child(body: str, *prefix: str, env: dict[str, str] | None = None, cwd: str | None = None, timeout: float = 300):
    """Run LEFT, then ``body`` (its parts separated by lines of ``#---``, each dedented on its
    own), in a fresh interpreter under ``prefix`` (prlimit, setpriv, ...)."""
    code = LEFT + "\n".join(textwrap.dedent(part) for part in body.split("#---"))
    return subprocess.run(
        [*prefix, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


# ---- an exception at any point of arena creation leaves nothing -----------------------


def test_an_interrupt_at_any_line_of_arena_creation_leaves_nothing():
    # A KeyboardInterrupt raised at the k-th line event inside hostreg's staging code, for
    # every k until creation completes without one: a Ctrl-C can land at any of them.
    r = child(
        """
        import sys, torch, hostreg.torch as ht
        sd = {"a": torch.randn(1000), "b": torch.ones(10, dtype=torch.int64)}
        class Stop(KeyboardInterrupt): pass
        gc.collect(); gc.freeze()  # left() then scans only what the runs make, not all of torch
        k, interrupted = 0, 0
        while True:
            k += 1
            interrupt_at_line(k, Stop)
            try:
                st = ht.create_cpu_state_dict(sd)
            except KeyboardInterrupt:  # Stop, or (raised in the log handler the C core calls)
                sys.settrace(None)     # the interrupt delivered again right after that call
                interrupted += 1
                state = left()
                if state != "registrations=0 locked=0 shm_fds=0":
                    print(f"after an interrupt at line event {k}: {state}")
                    break
                continue
            sys.settrace(None)
            del st
            break
        print(interrupted, left())
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    count, state = r.stdout.strip().splitlines()[-1].split(" ", 1)
    assert state == NOTHING, r.stdout[-2000:]
    assert int(count) > 20, "the interrupts must have landed inside arena creation"


def test_a_raw_handle_cannot_crash_the_process():
    # Handles are objects owned by the extension: there is no integer to get wrong.
    r = child(
        """
        from hostreg import _hostreg
        for name in dir(_hostreg):
            fn = getattr(_hostreg, name)
            if "unregister" in name and callable(fn) and name != "host_unregister":
                try:
                    fn(1)
                except Exception as e:
                    print(name, type(e).__name__)
        print("alive")
        """
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("alive"), (r.returncode, r.stdout, r.stderr[-2000:])


# ---- a refused thread degrades, never aborts -------------------------------------------


@pytest.mark.parametrize("what", ["prepare", "copy"])
def test_refused_threads_degrade_to_the_calling_thread(what: str):
    # RLIMIT_NPROC 1 for an unprivileged user: every pthread_create fails with EAGAIN.
    body = """
        import torch, hostreg.torch as ht, resource
        sd = {"w": torch.arange(12 << 20, dtype=torch.float32)}  # 48 MiB: several threads' worth
        st = ht.create_cpu_state_dict(sd, pin_memory=False)
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))
        if WHAT == "prepare":
            st2 = ht.create_cpu_state_dict(sd, pin_memory=False)
            ht.copy_state_dict(sd, st2, threads=1)
            ok = torch.equal(st2["w"], sd["w"]); del st2
        else:
            ht.copy_state_dict(sd, st, threads=4)
            ok = torch.equal(st["w"], sd["w"])
        del st
        print(ok, left())
    """.replace("WHAT", repr(what))
    r = child(
        body,
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
        env={"OMP_NUM_THREADS": "1", "HOME": "/tmp"},
    )
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-2000:]}"
    assert r.stdout.split() == ["True", *NOTHING.split()], r.stdout


# ---- posix: a failed mlock leaves nothing locked, and names the cause ------------------


MAPS = """
    import ctypes, mmap, os, hostreg
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    P = os.sysconf("SC_PAGESIZE")
    def vm_locked(addr, n):
        # Does any VMA of [addr, addr+n) still carry VM_LOCKED ("lo" in VmFlags)?
        hit, flags = False, []
        for line in open("/proc/self/smaps"):
            if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                hit = lo < addr + n and hi > addr
            elif line.startswith("VmFlags:") and hit:
                flags += line.split()[1:]
        return "lo" in flags
"""


def test_a_prot_none_page_inside_the_range_leaves_nothing_locked():
    r = child(
        MAPS
        + """#---
        a = libc.mmap(None, 3 * P, 3, 0x22, -1, 0)   # PROT_READ|WRITE, MAP_PRIVATE|ANONYMOUS
        ctypes.memset(a, 1, 3 * P)
        libc.mprotect(ctypes.c_void_p(a + P), P, 0)  # the middle page: PROT_NONE
        code = int(hostreg.host_register(a, 3 * P))
        print(code, vm_locked(a, 3 * P), "PROT_NONE" in hostreg.last_error().message, left())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "False", "True", *NOTHING.split()], r.stdout


def test_a_shared_mapping_past_the_end_of_its_file_leaves_nothing_locked(tmp_path):
    f = tmp_path / "one-page"
    r = child(
        MAPS
        + f"""#---
        fd = os.open({str(f)!r}, os.O_RDWR | os.O_CREAT, 0o600); os.ftruncate(fd, P)
        a = libc.mmap(None, 4 * P, 3, 0x01, fd, 0)   # MAP_SHARED, 4 pages over a 1-page file
        code = int(hostreg.host_register(a, 4 * P))
        msg = hostreg.last_error().message
        print(code, vm_locked(a, 4 * P), "past the end of the file" in msg, "RLIMIT_MEMLOCK" not in msg and "out of memory" not in msg, left())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["1", "False", "True", "True", *NOTHING.split()], r.stdout


# ---- populate reaches every page -------------------------------------------------------


def test_populate_reaches_the_last_page_of_an_odd_length():
    # 32 MiB + 1 byte on 2 threads: a split that rounds each share down misses the last page,
    # which then faults in later (a SIGBUS if the tmpfs filled meanwhile).
    r = child(
        """
        import ctypes, os, mmap
        from hostreg import _hostreg
        P = os.sysconf("SC_PAGESIZE")
        n = (32 << 20) + 1
        fd = os.open("/dev/shm", os.O_TMPFILE | os.O_RDWR, 0o600); os.ftruncate(fd, n)
        m = mmap.mmap(fd, n)
        a = ctypes.addressof(ctypes.c_char.from_buffer(m))
        print(_hostreg.prepare_memory(a, n, fd))
        libc = ctypes.CDLL(None)
        pages = (n + P - 1) // P
        vec = (ctypes.c_ubyte * pages)()
        libc.mincore(ctypes.c_void_p(a), ctypes.c_size_t(n), vec)
        print(sum(v & 1 for v in vec), pages, os.fstat(fd).st_blocks * 512 >= n)
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    code, resident, pages, allocated = r.stdout.split()
    assert code == "0" and resident == pages and allocated == "True", r.stdout


# ---- HOSTREG_SHM_DIR is checked, and doctor judges it --------------------------------


@pytest.mark.parametrize(
    "value, words",
    [("/dev/shmm", "does not exist"), ("dev/shm", "not an absolute path"), ("/tmp", "not a tmpfs")],
)
def test_a_bad_shm_dir_is_an_error_naming_it(value: str, words: str):
    r = child(
        """
        import torch, hostreg, hostreg.torch as ht
        try:
            ht.create_cpu_state_dict({"w": torch.ones(10)})
            print("staged")
        except hostreg.StagingError as e:
            print("StagingError", "HOSTREG_SHM_DIR" in str(e), WORDS in str(e))
        print(left())
        """.replace("WORDS", repr(words)),
        env={"HOSTREG_SHM_DIR": value},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    first, state = r.stdout.strip().splitlines()
    assert first == "StagingError True True" and state == NOTHING, r.stdout
    rc = subprocess.run(
        [HOSTREG, "doctor", "--json"], capture_output=True, text=True, env={**os.environ, "HOSTREG_SHM_DIR": value}
    )
    assert rc.returncode == 1 and "HOSTREG_SHM_DIR" in rc.stdout, rc.stdout[-2000:]


def test_doctor_judges_the_shm_dir_in_use(tmp_path):
    # A 64 MiB tmpfs as HOSTREG_SHM_DIR, /dev/shm left large: doctor must judge the former.
    script = f"""
        set -e
        mount -t tmpfs -o size=64m tmpfs {tmp_path}
        HOSTREG_SHM_DIR={tmp_path} {HOSTREG} doctor --json --bytes 268435456 > {tmp_path}/out.json || true
        cp {tmp_path}/out.json {tmp_path}.json
        umount {tmp_path}
    """
    r = subprocess.run(["unshare", "-m", "sh", "-c", textwrap.dedent(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = Path(f"{tmp_path}.json").read_text()
    assert '"ok": false' in out and str(tmp_path) in out and "67,108,864" in out, out[-2000:]


# ---- a mapping torch cannot make leaves no descriptor ----------------------------------


def test_an_address_space_limit_is_a_staging_error_and_leaks_no_descriptor():
    r = child(
        """
        import resource, torch, hostreg, hostreg.torch as ht
        vsz = int(open("/proc/self/statm").read().split()[0]) * os.sysconf("SC_PAGESIZE")
        resource.setrlimit(resource.RLIMIT_AS, (vsz + (256 << 20), resource.RLIM_INFINITY))
        big = {"w": torch.zeros(1, dtype=torch.uint8).expand(1 << 29)}  # 512 MiB to stage: cannot be mapped now
        for _ in range(3):
            try:
                ht.create_cpu_state_dict(big)
                print("staged")
            except hostreg.StagingError as e:
                print("StagingError")
            except Exception as e:
                print(type(e).__name__, e)
        print(left())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.strip().splitlines()
    assert lines[:3] == ["StagingError"] * 3 and lines[3] == NOTHING, r.stdout


# ---- nothing is loaded from the working directory --------------------------------------


def test_an_empty_ld_library_path_element_loads_nothing_from_the_working_directory(tmp_path):
    marker = tmp_path / "constructor-ran"
    src = tmp_path / "evil.c"
    src.write_text(
        f'#include <stdio.h>\n__attribute__((constructor)) static void hi(void) {{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n'
        "int hipGetDeviceCount(int* n) { *n = 1; return 0; }\n"
    )
    for name in ("libamdhip64.so", "libcuda.so.1", "libascendcl.so", "libze_loader.so.1", "libmusart.so"):
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / name), str(src)], check=True)
    r = child(
        "print(hostreg.backend(), left())",
        env={"LD_LIBRARY_PATH": ":/nonexistent", "HOSTREG_BACKEND": ""},
        cwd=str(tmp_path),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert not marker.exists(), "a library in the working directory was loaded"
    assert r.stdout.split()[0] == "posix"


# ---- hostreg stage accepts an arena split into chunks ----------------------------------


def test_stage_verifies_a_chunked_arena():
    # HOSTREG_MAX_REGISTRATION caps one registration, as some runtimes cap it themselves.
    r = subprocess.run(
        [HOSTREG, "stage", "--model", "tiny"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", "HOSTREG_MAX_REGISTRATION": "65536"},
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert int(table_row(r.stdout, "registrations")) > 5 and table_row(r.stdout, "values verified") == "yes"
    r = subprocess.run(
        [HOSTREG, "stage", "--model", "tiny"],
        capture_output=True,
        text=True,
        env={**os.environ, "HOSTREG_MAX_REGISTRATION": "lots"},
        timeout=300,
    )
    assert r.returncode == 1 and "HOSTREG_MAX_REGISTRATION=lots is not a positive number" in r.stdout + r.stderr


# ---- the arena index under collections, interrupts and fork -----------------------------


def test_a_collection_while_the_arena_index_is_locked_does_not_hang():
    # A garbage collection can start inside any allocation, also one hostreg makes while it
    # holds its index lock; freeing an arena from there must not need that lock.
    try:
        r = child(
            """
            import gc, torch, hostreg.torch as ht
            from hostreg.torch import _sharing
            sd = ht.create_cpu_state_dict({"w": torch.zeros(4)})
            cycle = [sd]; cycle.append(cycle)
            del sd, cycle
            with _sharing._lock:
                gc.collect()  # frees the staged dict and its arena
            print(left())
            """,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("freeing an arena while the index lock was held hung")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == NOTHING


def test_an_interrupt_during_arena_creation_leaves_every_live_arena_known():
    # A KeyboardInterrupt at the k-th line event of hostreg's code while another arena is
    # made, for every k: the live arena must stay known (else torch's reducer would copy its
    # tensors out of it), and the interrupted one must leave nothing.
    r = child(
        """
        import sys, torch, hostreg, hostreg.torch as ht
        from hostreg.torch import _sharing
        from multiprocessing.reduction import ForkingPickler
        live = ht.create_cpu_state_dict({"w": torch.ones(1000)})
        ptr = live["w"].data_ptr()
        interrupted = 0
        for k in range(1, 100000):
            interrupt_at_line(k)
            try:
                extra = ht.create_cpu_state_dict({"x": torch.zeros(10)})
            except KeyboardInterrupt:
                interrupted += 1
            else:
                break
            finally:
                sys.settrace(None)
            assert _sharing.staging_buffer_of(live["w"]) is not None, f"live arena unknown after an interrupt at line {k}"
            assert hostreg.stats().registrations == 1, f"after an interrupt at line {k}: {hostreg.registrations()}"
        del extra
        got = ForkingPickler.loads(ForkingPickler.dumps(live))  # what a Queue.put and get do
        assert live["w"].data_ptr() == ptr and hostreg.registration(ptr) is not None
        got["w"][0] = 7.0
        assert live["w"][0].item() == 7.0, "the arena was copied, not sent"
        del live, got
        print(interrupted, left())
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    count, rest = r.stdout.strip().split(" ", 1)
    assert int(count) > 20 and rest == NOTHING, r.stdout


def test_a_fork_while_another_thread_holds_the_arena_index_lock():
    r = child(
        """
        import os, signal, threading, time, torch, hostreg.torch as ht
        from hostreg.torch import _sharing
        holding, release = threading.Event(), threading.Event()
        def hold():
            with _sharing._lock:
                holding.set()
                release.wait()
        threading.Thread(target=hold).start()
        holding.wait()
        pid = os.fork()
        if pid == 0:
            signal.alarm(20)  # a child stuck on the inherited lock dies of SIGALRM
            st = ht.create_cpu_state_dict({"w": torch.ones(4)})
            os._exit(0 if _sharing.staging_buffer_of(st["w"]) is not None else 3)
        _, status = os.waitpid(pid, 0)
        release.set()
        print(os.waitstatus_to_exitcode(status), left())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "0 " + NOTHING, r.stdout


def test_sending_a_staged_storage_keeps_it_in_its_arena():
    r = child(
        """
        import torch, hostreg, hostreg.torch as ht
        from hostreg.torch import _sharing
        from multiprocessing.reduction import ForkingPickler
        st = ht.create_cpu_state_dict({"w": torch.zeros(1024)})
        ptr = st["w"].data_ptr()
        got = ForkingPickler.loads(ForkingPickler.dumps(st["w"].untyped_storage()))
        typed = ForkingPickler.loads(ForkingPickler.dumps(torch.TypedStorage(wrap_storage=st["w"].untyped_storage(), dtype=torch.float32, _internal=True)))
        same = st["w"].data_ptr() == ptr and hostreg.registration(ptr) is not None and _sharing.staging_buffer_of(st["w"]) is not None
        view = torch.empty(0, dtype=torch.float32).set_(got)
        view[0] = 5.0  # the received storage is the arena's memory, mapped again: not a copy
        print(same, st["w"][0].item(), typed.size(), len(got))
        del got, typed, view, st
        print(left())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    first, last = r.stdout.strip().splitlines()
    assert first == "True 5.0 1024 4096" and last == NOTHING, r.stdout


def test_tensors_torch_refuses_to_send_are_refused():
    r = child(
        """
        import torch, hostreg.torch as ht
        from multiprocessing.reduction import ForkingPickler
        st = ht.create_cpu_state_dict({"w": torch.zeros(8)})
        w = st["w"].requires_grad_()
        try:
            ForkingPickler.dumps(w[:4])  # a non-leaf view that requires grad
            print("sent")
        except RuntimeError as e:
            print("refused", "non-leaf" in str(e))
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["refused", "True"], r.stdout


def test_a_view_past_the_end_of_an_arena_is_refused():
    r = child(
        """
        import torch, hostreg.torch as ht
        from hostreg import _hostreg
        from hostreg.torch import _sharing
        st = ht.create_cpu_state_dict({"w": torch.zeros(8)})
        buf = _sharing.staging_buffer_of(st["w"])
        for ptr, n in ((buf.data_ptr, buf.size + 1), (buf.data_ptr + buf.size, 1), (buf.data_ptr - 1, 1), (buf.data_ptr, 1 << 62)):
            try:
                _hostreg.bytes_view(buf, ptr, n)
                print("made")
            except ValueError:
                print("refused")
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["refused"] * 4, r.stdout


# ---- smaller ones ----------------------------------------------------------------------


def test_copy_refuses_a_source_that_overlaps_its_destination():
    r = child(
        """
        import torch, hostreg.torch as ht
        sd = {"a": torch.arange(1000.0), "b": torch.arange(1000.0)}
        st = ht.create_cpu_state_dict(sd)
        ht.copy_state_dict(sd, st)
        from hostreg.torch import _sharing
        buf = _sharing.staging_buffer_of(st["a"])
        tail = _sharing.tensor_view(buf, st["a"].data_ptr() - buf.data_ptr + 2000, (1000,), torch.float32)  # a[500:] and on
        shifted = {"a": sd["a"], "b": tail}  # b's source overlaps a's destination
        for src in (shifted, {"a": st["b"], "b": torch.arange(2000.0)[::2]}):  # a's source is b's destination
            before = {k: v.clone() for k, v in st.items()}
            try:
                ht.copy_state_dict(src, st)
                print("copied")
            except ValueError as e:
                print("ValueError", "overlap" in str(e), all(torch.equal(st[k], before[k]) for k in st))
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["ValueError", "True", "True"] * 2, r.stdout


def test_copy_follows_a_destination_changed_in_place():
    # A destination that keeps its address and shape but changes its strides (t_()) or dtype
    # (.data = a view as another dtype) must get the source's values in its new layout.
    r = child(
        """
        import torch, hostreg.torch as ht
        src = {"m": torch.arange(9.0).reshape(3, 3), "v": torch.arange(4.0)}
        st = ht.create_cpu_state_dict(src)
        ht.copy_state_dict(src, st)
        st["m"].t_()
        st["v"].data = st["v"].data.view(torch.int32)
        new = {"m": src["m"] + 100, "v": src["v"] + 100}
        ht.copy_state_dict(new, st)
        print(torch.equal(st["m"], new["m"]), st["v"].tolist() == [100, 101, 102, 103])
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True"], r.stdout


def test_a_refused_relative_library_path_is_not_called_a_missing_driver():
    r = run_python(
        "from hostreg import _hostreg; print(_hostreg.probe_backend('cuda')[1])",
        env={"HOSTREG_CUDA_LIBRARY": "libcuda.so.1"},
    )
    assert r.returncode == 0, r.stderr
    assert "not an absolute path" in r.stdout and not r.stdout.startswith("no NVIDIA driver"), r.stdout


# ---- signals at random points ----------------------------------------------------------


def test_interrupts_at_random_points_of_staging_leave_nothing():
    # SIGALRM at a random moment of create + copy, its handler raising KeyboardInterrupt (a
    # Ctrl-C as Python delivers it), many times; after each, nothing may be left.
    runs = int(os.environ.get("HOSTREG_INTERRUPT_RUNS", "300"))
    r = child(
        f"""
        import random, signal, time, torch, hostreg.torch as ht
        sd = {{f"t{{i}}": torch.randn(16 << 10) for i in range(64)}}  # 4 MiB in 64 tensors
        typical = 1.0
        for _ in range(5):  # warm: the time one create + copy takes now
            t0 = time.perf_counter(); st = ht.create_cpu_state_dict(sd); ht.copy_state_dict(sd, st); del st
            typical = min(typical, time.perf_counter() - t0)
        gc.collect(); gc.freeze()  # left() then scans only what the runs make, not all of torch
        def stop(*_): raise KeyboardInterrupt
        signal.signal(signal.SIGALRM, stop)
        rng = random.Random(1201)
        interrupted = bad = 0
        for i in range({runs}):
            st = None
            try:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(1e-5, 1.1 * typical))
                st = ht.create_cpu_state_dict(sd)
                ht.copy_state_dict(sd, st)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except KeyboardInterrupt:
                interrupted += 1
            signal.setitimer(signal.ITIMER_REAL, 0)
            st = None
            state = left()
            if state != "registrations=0 locked=0 shm_fds=0":
                bad += 1
                print("run", i, state)
        print(interrupted, bad, left())
        """,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    interrupted, bad, state = r.stdout.strip().splitlines()[-1].split(" ", 2)
    assert bad == "0" and state == NOTHING, r.stdout[-3000:]
    assert int(interrupted) >= runs // 10, f"only {interrupted} of {runs} runs were interrupted: the test proves little"
    print(f"{interrupted} of {runs} runs interrupted, nothing left behind")


# ---- a staged dict saves like PyTorch's own staged copy, and loads as a plain dict -------


@pytest.mark.parametrize("how", ["create_cpu_state_dict", "Stager.stage"])
def test_a_staged_dict_of_several_dtypes_saves_and_loads_without_hostreg(tmp_path, how: str):
    path = tmp_path / "staged.pt"
    r = child(
        f"""
        import torch, hostreg.torch as ht
        sd = {{"w": torch.randn(64, 32), "i": torch.arange(10), "b": torch.tensor([True, False]),
              "h": torch.randn(8, dtype=torch.bfloat16), "step": torch.tensor(7.0), "e": torch.empty(0, 3)}}
        if {how!r} == "create_cpu_state_dict":
            st = ht.create_cpu_state_dict(sd); ht.copy_state_dict(sd, st)
        else:
            stager = ht.Stager(); st = stager.stage(sd)
        print(type(st).__name__, all(t.untyped_storage().nbytes() == t.nbytes for t in st.values()))
        torch.save(st, {str(path)!r})
        """
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[:2] == ["dict", "True"], r.stdout
    # A process where hostreg cannot even be imported, with torch.load's defaults (weights_only).
    r = run_python(
        f"""
import sys; sys.modules["hostreg"] = None
import torch
d = torch.load({str(path)!r})
print(type(d).__name__, sorted(d), d["i"].tolist(), d["b"].tolist(), d["step"].item(), tuple(d["e"].shape), d["h"].dtype)
"""
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (
        r.stdout.split("\n")[0]
        == "dict ['b', 'e', 'h', 'i', 'step', 'w'] [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] [True, False] 7.0 (0, 3) torch.bfloat16"
    ), r.stdout
