"""The bad-input matrix of docs/semantics.md, case by case.

The expected answers are read from the table in the docs, so the docs and the behaviour
cannot drift apart: a case here without a row there, or a row without a case, fails.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import PAGE, REPO, Buffer
from support import bad_inputs

import hostreg

DOC = REPO / "docs" / "semantics.md"


def documented() -> dict[str, str]:
    """{case: expected} from the matrix in docs/semantics.md."""
    text = Path(DOC).read_text(encoding="utf-8")
    table = text[text.index("## Bad-input matrix") :]
    rows = re.findall(r"^\| ([a-z0-9-]+) \| [^|]+ \| [^|]+ \| ([^|]+) \|$", table, re.M)
    return {case: expected.strip() for case, expected in rows if case != "case" and set(case) != {"-"}}


def shared(name: str) -> Callable[[Buffer], str]:
    def case(_: Buffer) -> str:
        answer, left = bad_inputs.run(name, hostreg.host_register, hostreg.host_unregister)
        assert not left, f"{name} left registrations behind"
        return answer

    return case


def raises(fn: Callable[[], object]) -> str:
    try:
        fn()
    except (TypeError, ValueError) as e:
        return f"`{type(e).__name__}`"
    return "no exception"


def with_registration(b: Buffer, then: Callable[[int], str]) -> str:
    assert hostreg.host_register(b.addr, 4 * PAGE) == 0
    try:
        return then(b.addr)
    finally:
        assert hostreg.host_unregister(b.addr) == 0


# The register/unregister cases are shared with scripts/gpu_check (tests/support/bad_inputs.py);
# the queries and the Python argument checks are hostreg's own.
CASES: dict[str, Callable[[Buffer], str]] = {
    **{name: shared(name) for name in bad_inputs.CASES},
    "device-pointer-unregistered": lambda b: str(int(hostreg.host_get_device_pointer(b.addr)[0])),
    "device-pointer-flags": lambda b: with_registration(
        b, lambda base: str(int(hostreg.host_get_device_pointer(base, 1)[0]))
    ),
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
