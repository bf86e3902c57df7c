"""hostreg.cudart(): the drop-in for torch._C._cudart, and the typed functions under it."""

from __future__ import annotations

import threading

import pytest
from conftest import PAGE, Buffer, low_memlock, run_python

import hostreg
from hostreg import _hostreg, cudaError

E = cudaError


def test_cudart_is_one_object_per_process():
    assert hostreg.cudart() is hostreg.cudart()
    assert hostreg.cudart().cudaError is cudaError


def test_cudaerror_behaves_like_torchs_and_reads_well():
    r = E.cudaErrorHostMemoryAlreadyRegistered
    assert int(r) == 712 and r.value == 712 and r == 712 and r != 0
    assert E(0) == E.success == 0 and E.success is E.cudaSuccess
    assert str(r) == "cudaErrorHostMemoryAlreadyRegistered (712)"
    assert f"{r}" == str(r) and f"{E.success}" == "cudaSuccess (0)"
    assert f"{r:d}" == "712" and f"{r:>5d}" == "  712"
    assert f"error: {E(1)}" == "error: cudaErrorInvalidValue (1)"


def test_enum_matches_the_c_table():
    for member in set(E):
        assert _hostreg.error_name(member.value) == member.cuda_name
        assert hostreg.cudart().cudaGetErrorString(member) == _hostreg.error_string(member.value)
        assert _hostreg.error_string(member.value) != "unrecognized error code"
    assert hostreg.cudart().cudaGetErrorString(712) == "part or all of the requested memory range is already mapped"
    # Every member of CUDA 13's enum cudaError, also those hostreg never answers itself (a
    # vendor runtime's 201 reaches callers as 201), and only those.
    c_table = [n for n in range(0, 20001) if _hostreg.error_name(n) != "unrecognized error code"]
    assert c_table == sorted({m.value for m in E}) and len(c_table) == 134
    assert (
        E(201).name == "cudaErrorDeviceUninitialized"
        and hostreg.cudart().cudaGetErrorName(5) == "cudaErrorProfilerDisabled"
    )
    assert hostreg.cudart().cudaGetErrorName(12345) == "unrecognized error code"


def test_register_really_locks_and_unregister_unlocks(buf: Buffer):
    rt = hostreg.cudart()
    before = hostreg.locked_bytes()
    assert rt.cudaHostRegister(buf.addr, buf.nbytes, 1) == E.success
    assert hostreg.locked_bytes() - before == buf.nbytes
    reg = hostreg.registration(buf.addr + 5)
    assert reg == hostreg.Registration(buf.addr, buf.nbytes, hostreg.HostRegisterFlags.Portable, buf.addr, "posix")
    assert hostreg.host_get_flags(buf.addr + 100) == (E.success, hostreg.HostRegisterFlags.Portable)
    assert hostreg.host_get_device_pointer(buf.addr + 100) == (E.success, buf.addr + 100)
    assert rt.cudaHostUnregister(buf.addr) == E.success
    assert hostreg.locked_bytes() == before
    assert hostreg.registration(buf.addr) is None


def test_register_keeps_contents(buf: Buffer):
    buf.map[:] = bytes(range(256)) * (buf.nbytes // 256)
    assert hostreg.host_register(buf.addr + 3, buf.nbytes - 3) == E.success
    assert buf.map[:] == bytes(range(256)) * (buf.nbytes // 256)
    assert hostreg.host_unregister(buf.addr + 3) == E.success


@pytest.mark.parametrize(
    "offset, nbytes, flags, code",
    [
        (None, PAGE, 0, E.cudaErrorInvalidValue),  # NULL pointer
        (0, 0, 0, E.cudaErrorInvalidValue),  # 0 bytes
        (0, PAGE, 0x10, E.cudaErrorInvalidValue),  # unknown flag bit
        (0, PAGE, 0x80000000, E.cudaErrorInvalidValue),
        (0, PAGE, 0x4, E.cudaErrorNotSupported),  # IoMemory: posix cannot honour it
    ],
)
def test_register_refusals(buf: Buffer, offset, nbytes, flags, code):
    ptr = 0 if offset is None else buf.addr + offset
    assert hostreg.host_register(ptr, nbytes, flags) == code
    err = hostreg.last_error()
    assert err.code == code and err.message
    assert hostreg.stats().registrations == 0


def test_wraparound_and_unmapped_memory():
    assert hostreg.host_register(2**64 - PAGE, 2 * PAGE) == E.cudaErrorInvalidValue
    assert "wraps" in hostreg.last_error().message
    b = Buffer(4 * PAGE)
    addr = b.addr
    b.close()  # unmapped now
    assert hostreg.host_register(addr, PAGE) == E.cudaErrorInvalidValue
    err = hostreg.last_error()
    assert "not (fully) mapped" in err.message and err.native == 12  # ENOMEM


def test_overlap_and_unregister_rules(buf: Buffer):
    a = buf.addr + 100
    assert hostreg.host_register(a, 1000) == E.success
    for ptr, n in [(a, 1000), (a - 50, 100), (a + 999, 10), (a + 10, 10), (a - 10, 2000)]:
        assert hostreg.host_register(ptr, n) == E.cudaErrorHostMemoryAlreadyRegistered, (ptr - a, n)
    assert "overlaps" in hostreg.last_error().message
    assert hostreg.host_register(a + 1000, 10) == E.success  # adjacent, shares a page
    assert hostreg.host_unregister(a + 1) == E.cudaErrorHostMemoryNotRegistered
    assert hostreg.host_unregister(buf.addr) == E.cudaErrorHostMemoryNotRegistered
    assert hostreg.host_unregister(a) == E.success
    assert hostreg.host_unregister(a) == E.cudaErrorHostMemoryNotRegistered
    assert hostreg.host_unregister(a + 1000) == E.success


def test_bad_python_arguments_raise_naming_the_argument(buf: Buffer):
    rt = hostreg.cudart()
    with pytest.raises(TypeError, match="ptr must be an int"):
        rt.cudaHostRegister("0x10", 10, 0)
    with pytest.raises(TypeError, match="nbytes must be an int, not float"):
        rt.cudaHostRegister(buf.addr, 1.5, 0)
    with pytest.raises(ValueError, match="ptr must be in"):
        rt.cudaHostUnregister(-1)
    with pytest.raises(ValueError, match="flags must be in"):
        rt.cudaHostRegister(buf.addr, 10, 2**32)
    assert hostreg.stats().registrations == 0


def test_calls_without_a_device_say_not_supported():
    rt = hostreg.cudart()
    assert rt.cudaProfilerStart() == E.cudaErrorNotSupported
    assert rt.cudaProfilerStop() == E.cudaErrorNotSupported
    assert rt.cudaStreamCreate(0) == E.cudaErrorNotSupported
    assert rt.cudaStreamDestroy(0) == E.cudaErrorNotSupported
    with pytest.raises(RuntimeError, match="cudaErrorNotSupported"):
        rt.cudaMemGetInfo(0)
    assert not hasattr(rt, "cudaOutputMode")  # torch.cuda.profiler.init checks for it (CUDA < 12 only)


def test_threads_register_disjoint_slots_concurrently():
    b = Buffer(256 * PAGE)
    slot = b.nbytes // 64 - 7  # slots are not page-aligned: neighbours share pages
    before = hostreg.locked_bytes()
    codes: list[int] = []

    def work(i: int) -> None:
        for _ in range(50):
            codes.append(hostreg.host_register(b.addr + i * slot, slot))
            codes.append(hostreg.host_unregister(b.addr + i * slot))
        codes.append(hostreg.host_register(b.addr + i * slot, slot))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert set(codes) == {0}
    assert hostreg.stats().registrations == 64
    assert hostreg.locked_bytes() - before >= 64 * slot
    for i in range(64):
        assert hostreg.host_unregister(b.addr + i * slot) == E.success
    assert hostreg.locked_bytes() == before
    b.close()


def test_bool_and_non_int_codes_are_refused(buf: Buffer):
    with pytest.raises(TypeError, match="nbytes must be an int, not bool"):
        hostreg.host_register(buf.addr, True)
    rt = hostreg.cudart()
    with pytest.raises(TypeError, match="error must be an int, not float"):
        rt.cudaGetErrorString(1.5)
    with pytest.raises(ValueError, match="error must be in"):
        rt.cudaGetErrorName(2**40)


def test_prot_none_memory_answers_1_naming_the_cause():
    import ctypes

    libc = ctypes.CDLL(None)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, 4 * PAGE, 0, 0x22, -1, 0)  # PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS
    try:
        assert hostreg.host_register(addr, 4 * PAGE) == E.cudaErrorInvalidValue
        assert "PROT_NONE" in hostreg.last_error().message
    finally:
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.munmap(addr, 4 * PAGE)


def test_edge_page_of_a_stale_registration_is_locked_again():
    # Memory freed while registered (a caller's bug) leaves a stale entry, as with CUDA; a new
    # neighbour sharing its edge page must still be locked for real.
    b = Buffer(8 * PAGE)
    a = b.addr
    assert hostreg.host_register(a + 10, PAGE) == E.success
    import ctypes

    libc = ctypes.CDLL(None)
    libc.munlock(ctypes.c_void_p(a), ctypes.c_size_t(8 * PAGE))  # what munmap would do to the lock
    before = hostreg.locked_bytes()
    assert hostreg.host_register(a + PAGE + 100, 2 * PAGE) == E.success  # shares page 1 with the stale one
    assert hostreg.locked_bytes() - before == 3 * PAGE
    assert hostreg.host_unregister(a + PAGE + 100) == E.success
    assert hostreg.host_unregister(a + 10) == E.success
    b.close()


def test_fork_child_starts_with_no_registration_and_forgets_the_parents():
    import os

    b = Buffer(16 * PAGE)
    assert hostreg.host_register(b.addr, b.nbytes) == E.success
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: no lock is inherited, so no registration either
        ok = (
            hostreg.stats().registrations == 0
            and hostreg.locked_bytes() == 0
            and hostreg.registration(b.addr) is None
            and hostreg.host_unregister(b.addr) == 0  # a finalizer of the parent's registration
            and hostreg.host_unregister(b.addr) == E.cudaErrorHostMemoryNotRegistered
            and hostreg.host_register(b.addr, PAGE) == 0
            and hostreg.locked_bytes() == PAGE
        )
        os.write(w, b"1" if ok else b"0")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    assert hostreg.registration(b.addr) is not None  # the parent's is untouched
    assert hostreg.host_unregister(b.addr) == E.success
    b.close()


FIRST_REFUSAL = """
import ctypes, mmap, torch, hostreg.torch
hostreg.torch.install()
torch.cuda.is_initialized = lambda: True  # as under transfer_to_npu: torch's cudart() is None, the drop-in answers
rt = torch.cuda.cudart()
m = mmap.mmap(-1, 16 << 20)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
print(int(rt.cudaHostRegister(addr, 16 << 20, 0)), int(rt.cudaHostRegister(addr, 16 << 20, 0)))
"""


@pytest.mark.parametrize("level", [None, "off", "warning"])
def test_the_first_refusal_through_the_drop_in_is_said_once_on_stderr(level):
    """PyTorch shows only its own words for a cudaError; hostreg says the first refusal's
    reason (here RLIMIT_MEMLOCK) once, unless HOSTREG_LOG_LEVEL chose what its log says."""
    env = {"HOSTREG_BACKEND": "posix"}
    if level is not None:
        env["HOSTREG_LOG_LEVEL"] = level
    else:
        env["HOSTREG_LOG_LEVEL"] = ""
    r = run_python(FIRST_REFUSAL, *low_memlock(), env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["2", "2"]  # cudaErrorMemoryAllocation, twice
    once = [line for line in r.stderr.splitlines() if "through hostreg's drop-in failed" in line]
    if level is None:
        assert len(once) == 1, r.stderr
        assert "16,777,216 bytes" in once[0] and "cudaErrorMemoryAllocation" in once[0] and "RLIMIT_MEMLOCK" in once[0]
    else:
        assert once == [], r.stderr
    if level == "off":
        assert r.stderr.strip() == "", r.stderr  # off is a level, not an unknown value
    if level == "warning":
        assert sum("RLIMIT_MEMLOCK" in line for line in r.stderr.splitlines()) == 2  # the log: every failure
