"""The register/unregister cases of the bad-input matrix (docs/semantics.md), for any pair of
``register(ptr, nbytes, flags) -> int`` and ``unregister(ptr) -> int`` that speaks CUDA's
codes: ``hostreg.host_register``/``host_unregister``, the real
``cudaHostRegister``/``cudaHostUnregister``, a backend's runtime.

Two suites run them: ``tests/python/test_bad_inputs.py`` against hostreg, with the answers
docs/semantics.md gives; ``scripts/gpu_check`` against the real CUDA runtime and hostreg's
cuda backend side by side, case by case, where the runtime's answer is the reference (so it
needs no table of its own). Each case runs on memory of its own (``Case.mem``) and returns
its answer as the docs write it ("1", "0, then 712"); whatever it leaves registered is undone
afterwards and reported. Python 3.9+, the standard library only (the GPU machine has no pip).
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Callable

PAGE = mmap.PAGESIZE
PROT_NONE, PROT_READ, PROT_RW = 0, mmap.PROT_READ, mmap.PROT_READ | mmap.PROT_WRITE

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


Register = Callable[[int, int, int], int]  # (ptr, nbytes, flags) -> cudaError number
Unregister = Callable[[int], int]  # (ptr) -> cudaError number


class Memory:
    """Private anonymous mappings for one case, every page written; :meth:`close` unmaps what
    is still mapped (after every registration on it is undone)."""

    def __init__(self) -> None:
        self._live: list[tuple[int, int]] = []

    def mapping(self, pages: int, prot: int = PROT_RW) -> int:
        n = pages * PAGE
        addr = _libc.mmap(None, n, PROT_RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if addr in (None, _MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap of {n} bytes failed")
        ctypes.memset(addr, 0x5A, n)  # present pages, as a tensor's are
        if prot != PROT_RW:
            if _libc.mprotect(addr, n, prot) != 0:
                raise OSError(ctypes.get_errno(), f"mprotect({prot}) of {n} bytes failed")
        self._live.append((addr, n))
        return addr

    def unmap(self, addr: int, nbytes: int) -> None:
        """Unmap [addr, addr + nbytes), the whole or the end of one mapping made here."""
        _libc.munmap(addr, nbytes)
        for i, (a, n) in enumerate(self._live):
            if a <= addr < a + n:
                self._live[i] = (a, addr - a)
        self._live = [(a, n) for a, n in self._live if n > 0]

    def close(self) -> None:
        for addr, n in self._live:
            _libc.munmap(addr, n)
        self._live.clear()


class Case:
    """One case run on one register/unregister pair: its calls, tracking what stays registered."""

    def __init__(self, register: Register, unregister: Unregister) -> None:
        self._register, self._unregister = register, unregister
        self.mem = Memory()
        self.live: set[int] = set()

    def reg(self, ptr: int, nbytes: int = PAGE, flags: int = 0) -> str:
        code = int(self._register(ptr, nbytes, flags))
        if code == 0:
            self.live.add(ptr)
        return str(code)

    def unreg(self, ptr: int) -> str:
        code = int(self._unregister(ptr))
        if code == 0:
            self.live.discard(ptr)
        return str(code)

    def registered(self, then: Callable[[int], str], offset: int = 2 * PAGE, nbytes: int = 4 * PAGE) -> str:
        """then(base) while [base, base + nbytes) is registered, base = offset into 8 fresh pages."""
        base = self.mem.mapping(8) + offset
        first = self.reg(base, nbytes)
        if first != "0":
            return f"registering failed: {first}"
        try:
            return then(base)
        finally:
            self.unreg(base)

    def finish(self) -> list[int]:
        """Undo what the case left registered (a finding of its own), then unmap its memory."""
        left = sorted(self.live)
        for ptr in left:
            self._unregister(ptr)
        self.live.clear()
        self.mem.close()
        return left


def _flag(flags: int) -> Callable[[Case], str]:
    def case(c: Case) -> str:
        b = c.mem.mapping(1)
        out = c.reg(b, PAGE, flags)
        if out == "0":
            c.unreg(b)
        return out

    return case


def _prot(prot: int, flags: int = 0) -> Callable[[Case], str]:
    def case(c: Case) -> str:
        b = c.mem.mapping(4, prot)
        out = c.reg(b, 4 * PAGE, flags)
        if out == "0":
            c.unreg(b)
        return out

    return case


def _freed(c: Case) -> str:
    b = c.mem.mapping(4)
    c.mem.unmap(b, 4 * PAGE)
    return c.reg(b)


def _partly_unmapped(c: Case) -> str:
    b = c.mem.mapping(4)
    c.mem.unmap(b + 2 * PAGE, 2 * PAGE)
    return c.reg(b, 4 * PAGE)


def _unknown_bits(c: Case) -> str:
    b = c.mem.mapping(1)
    answers = set()
    for bit in range(4, 32):
        out = c.reg(b, PAGE, 1 << bit)
        if out == "0":
            c.unreg(b)
        answers.add(out)
    return answers.pop() if len(answers) == 1 else "mixed " + ",".join(sorted(answers))


def _unaligned(c: Case) -> str:
    b = c.mem.mapping(2) + 100
    out = c.reg(b, 1000)
    return out if out != "0" else "0, then " + c.unreg(b)


def _shared_page_neighbour(c: Case) -> str:
    # The registration is not page-aligned: its first and last pages have room for others.
    def then(base: int) -> str:
        after = c.reg(base + 4 * PAGE, 100)  # starts where it ends, inside its last page
        before = c.reg(base - 100, 100)  # ends where it starts, inside its first page
        for p, o in ((base + 4 * PAGE, after), (base - 100, before)):
            if o == "0":
                c.unreg(p)
        return after if after == before else f"{after}/{before}"

    return c.registered(then, offset=2 * PAGE + 10)


def _unregister_twice(c: Case) -> str:
    b = c.mem.mapping(1)
    first = c.reg(b)
    if first != "0":
        return f"registering failed: {first}"
    once = c.unreg(b)
    return f"{once}, then {c.unreg(b)}"


def _unregister_freed(c: Case) -> str:
    b = c.mem.mapping(4)
    if c.reg(b, 4 * PAGE) != "0":
        return "registering failed"
    c.mem.unmap(b, 4 * PAGE)
    return c.unreg(b)


#: name -> the case; the names are the rows of docs/semantics.md's bad-input matrix.
CASES: dict[str, Callable[[Case], str]] = {
    "null-pointer": lambda c: c.reg(0),
    "zero-bytes": lambda c: c.reg(c.mem.mapping(1), 0),
    "huge-bytes": lambda c: c.reg(c.mem.mapping(1), 2**63),
    "wraparound": lambda c: c.reg(2**64 - PAGE, 2 * PAGE),
    "top-of-address-space": lambda c: c.reg(2**64 - PAGE, PAGE),
    "wild-pointer": lambda c: c.reg(0x10000),
    "freed-memory": _freed,
    "partly-unmapped": _partly_unmapped,
    "prot-none": _prot(PROT_NONE),
    "read-only-mapping": _prot(PROT_READ),
    "read-only-mapping-flag-readonly": _prot(PROT_READ, 0x8),
    "flag-portable": _flag(0x1),
    "flag-mapped": _flag(0x2),
    "flag-iomemory": _flag(0x4),
    "flag-readonly": _flag(0x8),
    "flag-all-known": _flag(0xF),
    "flag-unknown-bits": _unknown_bits,
    "unaligned-pointer": _unaligned,
    "double-register": lambda c: c.registered(lambda base: "0, then " + c.reg(base, 4 * PAGE)),
    "overlap-left": lambda c: c.registered(lambda base: c.reg(base - PAGE, 2 * PAGE)),
    "overlap-right": lambda c: c.registered(lambda base: c.reg(base + 3 * PAGE, 2 * PAGE)),
    "nested": lambda c: c.registered(lambda base: c.reg(base + PAGE, PAGE)),
    "nested-same-base": lambda c: c.registered(lambda base: c.reg(base, PAGE)),
    "enclosing": lambda c: c.registered(lambda base: c.reg(base - PAGE, 6 * PAGE)),
    "shared-page-neighbour": _shared_page_neighbour,
    "unregister-never": lambda c: c.unreg(c.mem.mapping(1)),
    "unregister-interior": lambda c: c.registered(lambda base: c.unreg(base + 1)),
    "unregister-twice": _unregister_twice,
    "unregister-null": lambda c: c.unreg(0),
    "unregister-freed": _unregister_freed,
}


def run(name: str, register: Register, unregister: Unregister) -> tuple[str, list[int]]:
    """(the answer of case `name` through this pair, the addresses it left registered, now undone)."""
    c = Case(register, unregister)
    try:
        return CASES[name](c), c.finish()
    except BaseException:
        c.finish()
        raise
