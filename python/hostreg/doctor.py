"""``hostreg doctor``: what hostreg can do on this machine, and whether staging will work.

:func:`diagnose` gathers facts without changing anything (it registers nothing; probing a
backend loads and initialises its runtime once); :func:`verdict` reads them.
"""

from __future__ import annotations

import os
import resource
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

from . import _hostreg, _proc

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
    torch_cudart: str  #: whether torch's own cudart() works, in words
    locked_bytes: int = 0  #: memory this process has locked already (VmLck)
    backend_note: str = ""  #: a caveat of the active backend, if any
    staging_bytes: int = DEFAULT_BYTES  #: the size the verdict is for
    problems: list[str] = field(default_factory=list)  #: filled by verdict()


def _thp(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1 : end] if 0 <= start < end else text.strip()


def _torch_cudart() -> tuple[str | None, str]:
    try:
        import torch
    except ImportError:
        return None, "torch not installed"
    from . import torch as ht

    original = getattr(torch.cuda.cudart, "__hostreg_original__", torch.cuda.cudart)
    try:
        rt = original()
    except Exception as e:  # noqa: BLE001 -- reported, not handled
        return torch.__version__, f"fails: {type(e).__name__}: {e}"
    if rt is None:
        return torch.__version__, "returns None"
    return torch.__version__, "works" + (" (hostreg.torch installed, keeps it)" if ht.is_installed() else "")


def diagnose(staging_bytes: int = DEFAULT_BYTES) -> Diagnosis:
    """Collect the facts ``doctor`` reports. Registers nothing.

    Raises ``ValueError`` unless ``staging_bytes`` > 0.
    """
    if staging_bytes <= 0:
        raise ValueError(f"staging bytes must be > 0, got {staging_bytes}")
    backends = []
    for name in _hostreg.backend_names():
        code, detail = _hostreg.probe_backend(name)
        _, flags, max_registration, granule, library, version, note, _ = _hostreg.backend_capabilities(name)
        backends.append(BackendReport(name, code == 0, detail, library, version, flags, granule, max_registration, note))
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
    torch_version, torch_cudart = _torch_cudart()
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
        locked_bytes=_proc.locked_bytes(),
        backend_note=_backend_note(active, backends),
        staging_bytes=staging_bytes,
    )


def describe_capabilities(b: BackendReport) -> str:
    """A backend's capabilities in words: flags honoured, granule, largest registration."""
    from ._core import HostRegisterFlags

    names = [f.name for f in HostRegisterFlags if f.value and b.flags & f.value]
    text = "flags " + ("|".join(n for n in names if n) or "none")
    text += ", any address" if b.granule <= 1 else f", whole {b.granule:,}-byte pages (edges shared)"
    if b.max_registration < 2**63:
        text += f", at most {b.max_registration / 2**30:g} GiB per registration"
    return text


def _backend_note(active: str, backends: list[BackendReport]) -> str:
    """The active backend's own note (what a success means), from its capabilities."""
    return next((b.note for b in backends if b.name == active), "")


def verdict(d: Diagnosis) -> list[str]:
    """Problems that would make staging ``d.staging_bytes`` fail (empty: it would work).

    Each names the limit and the fix. Also stored in ``d.problems``.
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


def to_json(d: Diagnosis) -> dict[str, Any]:
    """The diagnosis as plain JSON-able data."""
    out = asdict(d)
    out["ok"] = not d.problems
    return out


def probe_direct_io(directory: str | os.PathLike) -> tuple[bool, str]:
    """(True, "") when files in ``directory`` can be opened with O_DIRECT, as hostreg.torch's
    checkpoint writer and reader open them, else (False, why). Creates and removes one unnamed
    (O_TMPFILE) or temporary file there."""
    d = os.fspath(directory)
    try:
        fd = os.open(d, os.O_TMPFILE | os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC, 0o600)
        os.close(fd)
        return True, ""
    except OSError as e:
        if e.errno not in (22, 95):  # EINVAL: no O_DIRECT; EOPNOTSUPP: no O_TMPFILE, try a name
            return False, f"{d}: {e.strerror}"
    path = os.path.join(d, f".hostreg-probe-{secrets.token_hex(4)}")
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC, 0o600)
        os.close(fd)
        return True, ""
    except OSError as e:
        return False, f"{d} refuses O_DIRECT ({e.strerror}): checkpoints there go through the page cache"
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
