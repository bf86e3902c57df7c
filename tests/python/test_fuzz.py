"""Model-based fuzzing of register/unregister (Hypothesis stateful testing).

A reference model (a dict of live ranges) predicts every answer: 712 when any byte is
registered, 713 unless the pointer is a live base. After every step the registry's list,
its counters and the kernel's VmLck must equal the model's. Each step runs on one of
several worker threads (so per-thread state and cross-thread visibility are exercised);
a second test lets threads race on overlapping ranges and checks what any interleaving must
satisfy.

Bounded here (HOSTREG_FUZZ_EXAMPLES, default 150 sequences of up to 40 steps); `scripts/fuzz`
runs long campaigns.
"""

from __future__ import annotations

import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import hypothesis.strategies as st
from conftest import PAGE, Buffer
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import hostreg

PAGES = 32
EXAMPLES = int(os.environ.get("HOSTREG_FUZZ_EXAMPLES", "150"))
STEPS = {"count": 0}


def pages_of(ranges: dict[int, int]) -> int:
    pages: set[int] = set()
    for base, n in ranges.items():
        pages.update(range(base // PAGE, (base + n - 1) // PAGE + 1))
    return len(pages) * PAGE


class RegistryModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.buf = Buffer(PAGES * PAGE)
        self.base_locked = hostreg.locked_bytes()
        self.live: dict[int, int] = {}  # base address -> bytes
        self.workers = [ThreadPoolExecutor(max_workers=1) for _ in range(4)]  # one thread each

    def on(self, worker: int, fn, *args):  # run one call on the chosen worker thread
        return self.workers[worker].submit(fn, *args).result()

    def overlaps(self, lo: int, n: int) -> bool:
        return any(lo < b + m and b < lo + n for b, m in self.live.items())

    @rule(
        offset=st.integers(0, PAGES * PAGE - 1),
        n=st.integers(1, 6 * PAGE),
        flags=st.sampled_from([0, 1, 2, 3, 8]),
        worker=st.integers(0, 3),
    )
    def register(self, offset: int, n: int, flags: int, worker: int) -> None:
        n = min(n, PAGES * PAGE - offset)
        lo = self.buf.addr + offset
        expected = 712 if self.overlaps(lo, n) else 0
        got = self.on(worker, hostreg.host_register, lo, n, flags)
        assert int(got) == expected, (hex(lo), n, self.live)
        if expected == 0:
            self.live[lo] = n
        STEPS["count"] += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data(), worker=st.integers(0, 3))
    def unregister_live(self, data, worker: int) -> None:
        base = data.draw(st.sampled_from(sorted(self.live)))
        assert int(self.on(worker, hostreg.host_unregister, base)) == 0
        del self.live[base]
        STEPS["count"] += 1

    @rule(offset=st.integers(0, PAGES * PAGE - 1), worker=st.integers(0, 3))
    def unregister_any(self, offset: int, worker: int) -> None:
        ptr = self.buf.addr + offset
        expected = 0 if ptr in self.live else 713
        assert int(self.on(worker, hostreg.host_unregister, ptr)) == expected
        self.live.pop(ptr, None)
        STEPS["count"] += 1

    @invariant()
    def registry_equals_model(self) -> None:
        regs = [(r.base, r.nbytes) for r in hostreg.registrations()]
        assert regs == sorted(self.live.items())
        stats = hostreg.stats()
        assert stats.registrations == len(self.live)
        assert stats.bytes_registered == sum(self.live.values())
        assert stats.bytes_locked == pages_of(self.live)
        assert hostreg.locked_bytes() - self.base_locked == pages_of(self.live), "VmLck differs from the model"

    def teardown(self) -> None:
        for base in list(self.live):
            assert int(hostreg.host_unregister(base)) == 0
        for w in self.workers:
            w.shutdown()
        self.buf.close()


RegistryModel.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None, suppress_health_check=list(HealthCheck)
)
TestRegistryModel = RegistryModel.TestCase


def test_threads_racing_on_overlapping_ranges():
    """Whatever the interleaving: for each base, its successful registers and unregisters
    alternate (so they differ by 0 or 1, and 1 means live); live ranges never overlap; VmLck
    matches the live ranges."""
    buf = Buffer(PAGES * PAGE)
    before = hostreg.locked_bytes()
    bases = [buf.addr + k * PAGE // 2 + 7 for k in range(2 * PAGES - 8)]  # half-page steps: many overlap
    counts: dict[int, list[int]] = {b: [0, 0] for b in bases}
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(1500):
            b = rnd.choice(bases)
            if rnd.random() < 0.5:
                ok = int(hostreg.host_register(b, 3 * PAGE)) == 0
                with lock:
                    counts[b][0] += ok
            else:
                ok = int(hostreg.host_unregister(b)) == 0
                with lock:
                    counts[b][1] += ok

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    live = {r.base: r.nbytes for r in hostreg.registrations()}
    for b, (r, u) in counts.items():
        assert r - u == (1 if b in live else 0), (hex(b), r, u)
    spans = sorted(live.items())
    assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:])), "live registrations overlap"
    assert hostreg.locked_bytes() - before == pages_of(live)
    for b in live:
        assert int(hostreg.host_unregister(b)) == 0
    buf.close()


def teardown_module() -> None:
    print(f"\nfuzz: {STEPS['count']} model-checked steps")  # shown with pytest -s (scripts/fuzz)
