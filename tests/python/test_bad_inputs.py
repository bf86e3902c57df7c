"""The bad-input matrix of docs/semantics.md, case by case.

The expected answers are read from the table in the docs, so the docs and the behaviour
cannot drift apart: a case here without a row there, or a row without a case, fails.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import PAGE, REPO, Buffer

import hostreg

DOC = REPO / "docs" / "semantics.md"
libc = ctypes.CDLL(None)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PROT_NONE, PROT_READ, PROT_RW = 0, 1, 3
MAP_PRIVATE_ANON = 0x22


def documented() -> dict[str, str]:
    """{case: expected} from the matrix in docs/semantics.md."""
    text = Path(DOC).read_text(encoding="utf-8")
    table = text[text.index("## Bad-input matrix") :]
    rows = re.findall(r"^\| ([a-z0-9-]+) \| [^|]+ \| [^|]+ \| ([^|]+) \|$", table, re.M)
    return {case: expected.strip() for case, expected in rows if case != "case" and set(case) != {"-"}}


def mapping(pages: int, prot: int = PROT_RW) -> int:
    addr = libc.mmap(None, pages * PAGE, prot, MAP_PRIVATE_ANON, -1, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    return addr


def reg(ptr: int, n: int = PAGE, flags: int = 0) -> str:
    return str(int(hostreg.host_register(ptr, n, flags)))


def unreg(ptr: int) -> str:
    return str(int(hostreg.host_unregister(ptr)))


def raises(fn: Callable[[], object]) -> str:
    try:
        fn()
    except (TypeError, ValueError) as e:
        return f"`{type(e).__name__}`"
    return "no exception"


def with_registration(b: Buffer, then: Callable[[int], str], offset: int = 2 * PAGE, n: int = 4 * PAGE) -> str:
    base = b.addr + offset
    assert reg(base, n) == "0"
    try:
        return then(base)
    finally:
        assert unreg(base) == "0"


def freed_memory(_: Buffer) -> str:
    addr = mapping(4)
    libc.munmap(addr, 4 * PAGE)
    return reg(addr)


def prot_mapping(prot: int, flags: int = 0) -> str:
    addr = mapping(4, prot)
    try:
        out = reg(addr, 4 * PAGE, flags)
        if out == "0":
            assert unreg(addr) == "0"
        return out
    finally:
        libc.munmap(addr, 4 * PAGE)


def unknown_bits(b: Buffer) -> str:
    answers = {reg(b.addr, PAGE, 1 << bit) for bit in range(4, 32)}
    return answers.pop() if len(answers) == 1 else f"mixed {answers}"


def register_then(b: Buffer, flags: int) -> str:
    out = reg(b.addr, PAGE, flags)
    if out == "0":
        assert unreg(b.addr) == "0"
    return out


def unregister_freed(_: Buffer) -> str:
    addr = mapping(4)
    assert reg(addr, 4 * PAGE) == "0"
    libc.munmap(addr, 4 * PAGE)
    return unreg(addr)


def shared_page_neighbour(b: Buffer) -> str:
    # The registration is not page-aligned: its first and last pages have room for others.
    def then(base: int) -> str:
        after = reg(base + 4 * PAGE, 100)  # starts where it ends, inside its last page
        before = reg(base - 100, 100)  # ends where it starts, inside its first page
        for p, o in ((base + 4 * PAGE, after), (base - 100, before)):
            if o == "0":
                assert unreg(p) == "0"
        return after if after == before else f"{after}/{before}"

    return with_registration(b, then, offset=2 * PAGE + 10)


CASES: dict[str, Callable[[Buffer], str]] = {
    "null-pointer": lambda b: reg(0),
    "zero-bytes": lambda b: reg(b.addr, 0),
    "huge-bytes": lambda b: reg(b.addr, 2**63),
    "wraparound": lambda b: reg(2**64 - PAGE, 2 * PAGE),
    "top-of-address-space": lambda b: reg(2**64 - PAGE, PAGE),
    "wild-pointer": lambda b: reg(0x10000),
    "freed-memory": freed_memory,
    "prot-none": lambda b: prot_mapping(PROT_NONE),
    "read-only-mapping": lambda b: prot_mapping(PROT_READ),
    "flag-portable": lambda b: register_then(b, 0x1),
    "flag-mapped": lambda b: register_then(b, 0x2),
    "flag-iomemory": lambda b: register_then(b, 0x4),
    "flag-readonly": lambda b: register_then(b, 0x8),
    "flag-all-known": lambda b: register_then(b, 0xF),
    "flag-unknown-bits": unknown_bits,
    "double-register": lambda b: with_registration(b, lambda base: "0, then " + reg(base, 4 * PAGE)),
    "overlap-left": lambda b: with_registration(b, lambda base: reg(base - PAGE, 2 * PAGE)),
    "overlap-right": lambda b: with_registration(b, lambda base: reg(base + 3 * PAGE, 2 * PAGE)),
    "nested": lambda b: with_registration(b, lambda base: reg(base + PAGE, PAGE)),
    "enclosing": lambda b: with_registration(b, lambda base: reg(base - PAGE, 6 * PAGE)),
    "shared-page-neighbour": shared_page_neighbour,
    "unregister-never": lambda b: unreg(b.addr),
    "unregister-interior": lambda b: with_registration(b, lambda base: unreg(base + 1)),
    "unregister-twice": lambda b: (reg(b.addr) == "0" and unreg(b.addr) == "0" and "0, then " + unreg(b.addr)) or "?",
    "unregister-null": lambda b: unreg(0),
    "unregister-freed": unregister_freed,
    "device-pointer-unregistered": lambda b: str(int(hostreg.host_get_device_pointer(b.addr)[0])),
    "device-pointer-flags": lambda b: with_registration(b, lambda base: str(int(hostreg.host_get_device_pointer(base, 1)[0]))),
    "flags-unregistered": lambda b: str(int(hostreg.host_get_flags(b.addr)[0])),
    "py-pointer-str": lambda b: raises(lambda: hostreg.host_register("0x10", PAGE)),  # type: ignore[arg-type]
    "py-pointer-float": lambda b: raises(lambda: hostreg.host_register(1.5, PAGE)),  # type: ignore[arg-type]
    "py-pointer-none": lambda b: raises(lambda: hostreg.host_register(None, PAGE)),  # type: ignore[arg-type]
    "py-bytes-bool": lambda b: raises(lambda: hostreg.host_register(b.addr, True)),
    "py-pointer-negative": lambda b: raises(lambda: hostreg.host_register(-1, PAGE)),
    "py-pointer-too-large": lambda b: raises(lambda: hostreg.host_register(2**64, PAGE)),
    "py-flags-too-large": lambda b: raises(lambda: hostreg.host_register(b.addr, PAGE, 2**32)),
    "py-unregister-negative": lambda b: raises(lambda: hostreg.host_unregister(-4096)),
    "py-error-string-float": lambda b: raises(lambda: hostreg.cudart().cudaGetErrorString(1.5)),  # type: ignore[arg-type]
}


def test_docs_and_cases_list_the_same_cases():
    assert set(documented()) == set(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input(case: str, buf: Buffer):
    expected = documented()[case]
    got = CASES[case](buf)
    assert got == expected, f"{case}: got {got}, docs say {expected} ({hostreg.last_error().message})"
    assert hostreg.stats().registrations == 0
