"""``hostreg doctor``: what hostreg can do on this machine, and whether staging will work.

:func:`diagnose` gathers facts without changing anything (it registers nothing; probing a
backend loads and initialises its runtime once); :func:`verdict` reads them; :func:`render`
prints them as the ``hostreg doctor`` command does.

The command runs in a process of its own, which cannot see what the user's program did to
torch (Ascend's ``transfer_to_npu`` replacing ``torch.cuda``, ``import hostreg.auto``).
:func:`report` runs the same diagnosis inside the program, where it sees those::

    import torch_npu
    from torch_npu.contrib import transfer_to_npu
    import hostreg.doctor
    hostreg.doctor.report()   # prints the report; returns the Diagnosis
"""

from __future__ import annotations

import os
import resource
import sys
from dataclasses import asdict, dataclass, field
from typing import IO, Any

from . import _hostreg, _proc
from ._report import describe_capabilities, probe_direct_io, render

__all__ = [
    "BackendReport",
    "DEFAULT_BYTES",
    "Diagnosis",
    "describe_capabilities",
    "diagnose",
    "probe_direct_io",
    "render",
    "report",
    "to_json",
    "verdict",
]

DEFAULT_BYTES = 497_759_232  # the embedded default model (GPT-2 small, fp32)


@dataclass
class BackendReport:
    """One backend as its probe found it (``hostregBackendCapabilities``)."""

    name: str
    available: bool
    detail: str  #: library path and version when available, else why not
    library: str = ""  #: the runtime file loaded (real path), "" if none loaded
    version: str = ""  #: the runtime's version in its own terms
    flags: int = 0  #: cudaHostRegister flags honoured (others answer 801); 0 if unavailable
    granule: int = 1  #: bytes the runtime registers in (1: any range); hostreg rounds out to them
    max_registration: int = 0  #: most bytes one registration may span
    note: str = ""  #: what a success means with this backend


@dataclass
class Diagnosis:
    backends: list[BackendReport]
    auto: str  #: what HOSTREG_BACKEND=auto picks
    requested: str  #: HOSTREG_BACKEND as set ("auto" if unset)
    active: str  #: what this process uses ("none" if unusable)
    active_reason: str  #: why "none", when it is
    memlock_bytes: int | None  #: RLIMIT_MEMLOCK soft limit, None = unlimited
    cap_ipc_lock: bool
    shm_dir: str  #: where staging memory is made: HOSTREG_SHM_DIR, else /dev/shm
    shm_dir_problem: str  #: why HOSTREG_SHM_DIR cannot be used ("" when it can)
    settings_problems: list[str]  #: other HOSTREG_* settings that would make staging fail, in staging's own words
    shm_bytes: int | None  #: size of shm_dir's filesystem, None if absent
    shm_free_bytes: int | None
    nofile: int  #: RLIMIT_NOFILE soft limit
    thp: str  #: transparent huge pages mode for anonymous memory
    thp_shmem: str  #: ... for tmpfs/shm
    torch: str | None  #: torch version, None if not installed
    torch_cudart: str  #: whether torch's own cudart() works, in words (hostreg's drop-in aside)
    pytorch_cudart: str = ""  #: what torch.cuda.cudart() gives PyTorch's code in this process now, in words
    dropin: str = "not installed"  #: the state of hostreg's drop-in (hostreg.torch.install), in words
    locked_bytes: int = 0  #: memory this process has locked already (VmLck)
    backend_note: str = ""  #: a caveat of the active backend, if any
    staging_bytes: int = DEFAULT_BYTES  #: the size the verdict is for
    problems: list[str] = field(default_factory=list)  #: filled by verdict()
    #: What will fail outside hostreg's own staging (PyTorch's pinning path), with the fix;
    #: filled by verdict(), and no reason for ``hostreg doctor`` to exit 1.
    warnings: list[str] = field(default_factory=list)


def _thp(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else text.strip()


# What PyTorch's pinning path does with torch.cuda.cudart()'s answer (torch/utils/_pin_memory
# paths: torch.distributed.checkpoint._state_dict_utils._create_cpu_state_dict and DCP's
# DefaultStager call `torch.cuda.cudart().cudaHostRegister(ptr, size, 1)`; docs/pytorch.md).
_PINNING = "PyTorch's pinning of shared memory (_create_cpu_state_dict(..., share_memory=True, pin_memory=True), DCP's DefaultStager with pinning on)"
_FIX = (
    "the one-line fix: `import hostreg.auto` at the top of the program (or HOSTREG_AUTO_INSTALL=1 in its "
    "environment), which routes torch.cuda.cudart() to hostreg where torch has no CUDA runtime"
)


def _describe_cudart(call: Any, own: bool = False) -> tuple[str, str]:
    """(in words, the crash it leads to or "") for what ``call()`` (a torch.cuda.cudart) gives;
    ``own``: ``call`` is torch's own function."""
    from ._cudart import cudart as hostreg_cudart

    try:
        rt = call()
    except Exception as e:  # noqa: BLE001 -- reported, not handled
        return f"fails: {type(e).__name__}: {e}", f"{type(e).__name__}: {e}"
    if rt is None:
        return "returns None", "AttributeError: 'NoneType' object has no attribute 'cudaHostRegister'"
    if rt is hostreg_cudart():
        if own:  # the drop-in set torch.cuda._cudart, which torch's own cudart() returns
            return "returns torch.cuda._cudart, which hostreg's drop-in set (a CPU build of torch leaves it None)", ""
        return "hostreg's cudart (the drop-in): registrations go through hostreg's active backend", ""
    return "torch's own CUDA runtime", ""


def _torch_state() -> tuple[str | None, str, str, str, str]:
    """(torch version or None, torch's own cudart() in words, what PyTorch's code gets from
    torch.cuda.cudart() now in words, the drop-in's state in words, the crash PyTorch's pinning
    path meets in this process or "")."""
    try:
        import torch
    except ImportError:
        return None, "torch not installed", "torch not installed", "not installed (no torch)", ""
    from . import _dropin

    current = torch.cuda.cudart
    original = getattr(current, "__hostreg_original__", None)
    own, own_crash = _describe_cudart(original or current, own=True)
    if original is not None:
        now, crash = _describe_cudart(current)
        if now.startswith("hostreg's cudart"):
            now = "hostreg's cudart, through the drop-in (torch has no CUDA runtime here)"
        elif not crash:
            now = "torch's own CUDA runtime, through the drop-in (which keeps it where it works)"
        state = "installed: torch.cuda.cudart() answers with hostreg where torch has no CUDA runtime"
    elif _dropin.is_installed():
        now, crash = _describe_cudart(current)
        state = (
            "installed, but torch.cuda.cudart was replaced after it (by "
            f"{getattr(current, '__module__', '?')}.{getattr(current, '__qualname__', '?')}): PyTorch's code calls that, "
            "not hostreg's; install hostreg's drop-in after whatever replaces it"
        )
    else:
        now, crash = own, own_crash
        state = "not installed" + (
            " (import hostreg.auto waits for torch.cuda)" if "hostreg.auto" in sys.modules else ""
        )
    return torch.__version__, own, now, state, crash


def diagnose(staging_bytes: int = DEFAULT_BYTES) -> Diagnosis:
    """Collect the facts ``doctor`` reports. Registers nothing.

    Raises ``ValueError`` unless ``staging_bytes`` > 0.
    """
    if staging_bytes <= 0:
        raise ValueError(f"staging bytes must be > 0, got {staging_bytes}")
    backends = []
    for name in _hostreg.backend_names():
        # One probe per backend: hostregBackendCapabilities probes as hostregProbeBackend does.
        c = _hostreg.backend_capabilities(name)
        detail = c.reason if c.code else " ".join(x for x in (c.library, c.version) if x)
        backends.append(
            BackendReport(
                name, c.code == 0, detail, c.library, c.version, c.flags, c.granule, c.max_registration, c.note
            )
        )
    auto = next(b.name for b in backends if b.available)
    active = _hostreg.backend_name()
    reason = _hostreg.last_error()[2] if active == "none" else ""
    allowance = _hostreg.lock_allowance()  # (RLIMIT_MEMLOCK or None, CAP_IPC_LOCK): the posix backend's reading
    shm: int | None
    shm_free: int | None
    code, shm_dir = _hostreg.shared_memory_directory()  # the one staging will use, checked as staging checks it
    shm_problem = _hostreg.last_error()[2] if code else ""
    code, _ = _hostreg.max_registration()  # read by the parser staging uses
    settings_problems = [_hostreg.last_error()[2]] if code else []
    try:
        st = os.statvfs(shm_dir)
        shm, shm_free = st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail
    except OSError:
        shm = shm_free = None
    torch_version, torch_cudart, pytorch_cudart, dropin, crash = _torch_state()
    return Diagnosis(
        backends=backends,
        auto=auto,
        requested=os.environ.get("HOSTREG_BACKEND") or "auto",
        active=active,
        active_reason=reason,
        memlock_bytes=allowance[0],
        cap_ipc_lock=allowance[1],
        shm_dir=shm_dir,
        shm_dir_problem=shm_problem,
        settings_problems=settings_problems,
        shm_bytes=shm,
        shm_free_bytes=shm_free,
        nofile=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        thp=_thp("/sys/kernel/mm/transparent_hugepage/enabled"),
        thp_shmem=_thp("/sys/kernel/mm/transparent_hugepage/shmem_enabled"),
        torch=torch_version,
        torch_cudart=torch_cudart,
        pytorch_cudart=pytorch_cudart,
        dropin=dropin,
        warnings=[f"{_PINNING} will fail in this process with {crash}; {_FIX}"] if crash else [],
        locked_bytes=_proc.locked_bytes(),
        backend_note=_backend_note(active, backends),
        staging_bytes=staging_bytes,
    )


def _backend_note(active: str, backends: list[BackendReport]) -> str:
    """The active backend's own note (what a success means), from its capabilities."""
    return next((b.note for b in backends if b.name == active), "")


def verdict(d: Diagnosis) -> list[str]:
    """Problems that would make staging ``d.staging_bytes`` fail (empty: it would work).

    Each names the limit and the fix. Also stored in ``d.problems``. (What fails outside
    hostreg's staging, PyTorch's own pinning path, is in ``d.warnings``, set by :func:`diagnose`.)
    """
    need = d.staging_bytes
    # Locking works in whole pages, and PyTorch's per-tensor path rounds every tensor up to
    # pages: allow one page per 64 KiB on top, plus what this process has locked already.
    page = os.sysconf("SC_PAGESIZE")
    lock_need = -(-need // page) * page + -(-need // 65536) * page + d.locked_bytes
    problems = []
    if d.active == "none":
        problems.append(f"no backend is usable: {d.active_reason}")
    if d.active == "posix" and not d.cap_ipc_lock and d.memlock_bytes is not None and d.memlock_bytes < lock_need:
        problems.append(
            f"RLIMIT_MEMLOCK is {d.memlock_bytes // 1024} KiB and CAP_IPC_LOCK is not held: locking "
            f"{need:,} bytes (about {lock_need:,} in whole pages, with what is locked already) will fail "
            "with cudaErrorMemoryAllocation; run `ulimit -l unlimited` (docker: --ulimit memlock=-1) or "
            "grant CAP_IPC_LOCK"
        )
    problems += d.settings_problems
    if d.shm_dir_problem:
        problems.append(d.shm_dir_problem)
    elif d.shm_free_bytes is not None and d.shm_bytes and d.shm_free_bytes < need:  # 0 blocks: no size limit (ramfs)
        problems.append(
            f"{d.shm_dir} has {d.shm_free_bytes:,} bytes free of {d.shm_bytes:,}, less than the {need:,} "
            "bytes to stage; enlarge it (docker: --shm-size"
            + (", or mount -o remount,size=... " + d.shm_dir if d.shm_dir != "/dev/shm" else "")
            + ")"
        )
    d.problems = problems
    return problems


def report(
    staging_bytes: int = DEFAULT_BYTES,
    *,
    file: IO[str] | None = None,
    width: int | None = None,
    checkpoint_dirs: tuple[str, ...] | list[str] = (),
) -> Diagnosis:
    """Diagnose this process and print the report ``hostreg doctor`` prints, to ``file``
    (default ``sys.stderr``), ``width`` columns wide (default: the terminal's, else 80).

    Unlike the command, this sees what the program has done to torch: Ascend's
    ``transfer_to_npu`` (after which torch's own ``torch.cuda.cudart()`` returns None), whether
    hostreg's drop-in is installed, and whether something replaced ``torch.cuda.cudart`` after
    it. Call it where the program saves, after its setup. Registers nothing; imports torch if
    it is installed. Returns the :class:`Diagnosis` (``problems``: what would make staging
    ``staging_bytes`` bytes fail; ``warnings``: what will fail in PyTorch's own pinning path,
    with the fix). Raises ``ValueError`` unless ``staging_bytes`` > 0.
    """
    from rich.console import Console

    d = diagnose(staging_bytes)
    verdict(d)
    render(d, Console(file=file or sys.stderr, width=width, highlight=False), checkpoint_dirs)
    return d


def to_json(d: Diagnosis) -> dict[str, Any]:
    """The diagnosis as plain JSON-able data."""
    out = asdict(d)
    out["ok"] = not d.problems
    return out
