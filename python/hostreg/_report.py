"""How ``hostreg doctor`` shows a diagnosis (``doctor.py`` gathers it): the backends'
capabilities in words, the tables and the verdict printed by :func:`render`, and the probe of
a checkpoint directory's O_DIRECT support."""

from __future__ import annotations

import os
import secrets
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .doctor import BackendReport, Diagnosis


def describe_capabilities(b: BackendReport) -> str:
    """A backend's capabilities in words: flags honoured, granule, largest registration."""
    from ._core import HostRegisterFlags

    names = [f.name for f in HostRegisterFlags if f.value and b.flags & f.value]
    text = "flags " + ("|".join(n for n in names if n) or "none")
    text += ", any address" if b.granule <= 1 else f", whole {b.granule:,}-byte pages (edges shared)"
    if b.max_registration < 2**63:
        text += f", at most {b.max_registration / 2**30:g} GiB per registration"
    return text


def render(
    d: Diagnosis, console: Any, checkpoint_dirs: tuple[str, ...] | list[str] = (), *, own_process: bool = False
) -> None:
    """Print ``d`` (after :func:`verdict`) to ``console`` (a ``rich.console.Console``) as
    ``hostreg doctor`` does: the backends, the limits that decide staging, the drop-in's state,
    the verdict and the warnings. Each table has at most three columns, so that at 80 columns
    a reason still reads as a sentence. ``checkpoint_dirs``: directories whose O_DIRECT
    support is probed (:func:`probe_direct_io`) and shown. ``own_process``: the diagnosis is of
    a process of its own (the command), not the user's program: say how to see the program's."""
    from rich.markup import escape as esc
    from rich.table import Table

    def size(n: int | None) -> str:
        return "unlimited" if n is None else f"{n:,} bytes ({n / 2**30:.2f} GiB)"

    backends = Table(title="hostreg doctor: backends (HOSTREG_BACKEND=auto tries them in this order)")
    backends.add_column("backend", no_wrap=True)
    backends.add_column("available", no_wrap=True)
    backends.add_column("runtime and capabilities, or why not", overflow="fold")
    for b in d.backends:
        mark = (" [bold](auto)[/]" if b.name == d.auto else "") + (
            " [bold green](active)[/]" if b.name == d.active else ""
        )
        runtime = " ".join(x for x in (b.library, f"({b.version})" if b.version and b.library else b.version) if x)
        detail = describe_capabilities(b) if b.available else b.detail
        backends.add_row(
            b.name + mark, "yes" if b.available else "no", esc("\n".join(x for x in (runtime, detail) if x))
        )
    console.print(backends, soft_wrap=False)

    limits = Table(title="limits that decide staging", show_header=False)
    limits.add_column("what", ratio=2)
    limits.add_column("value", ratio=3, overflow="fold")
    limits.add_row("HOSTREG_BACKEND", esc(d.requested))
    limits.add_row("active backend", esc(d.active + (f" ({d.active_reason})" if d.active_reason else "")))
    limits.add_row("RLIMIT_MEMLOCK (ulimit -l)", size(d.memlock_bytes))
    limits.add_row("CAP_IPC_LOCK", "held" if d.cap_ipc_lock else "not held")
    limits.add_row("locked by this process (VmLck)", size(d.locked_bytes))
    shm_label = d.shm_dir + (" (HOSTREG_SHM_DIR)" if os.environ.get("HOSTREG_SHM_DIR") else "")
    shm_room = (
        "no size limit (ramfs, tmpfs size=0, hugetlbfs without size=)"
        if d.shm_bytes == 0
        else (f"{size(d.shm_bytes)} / {size(d.shm_free_bytes)}")
    )
    limits.add_row(f"{esc(shm_label)} size / free", esc(d.shm_dir_problem or shm_room))
    limits.add_row("open files (ulimit -n)", str(d.nofile))
    limits.add_row("transparent huge pages (anon / shmem)", f"{d.thp} / {d.thp_shmem}")
    for directory in checkpoint_dirs:
        ok, why = probe_direct_io(directory)
        limits.add_row(f"checkpoints in {esc(directory)}", "O_DIRECT (disk speed, no page cache)" if ok else esc(why))
    console.print(limits)

    pytorch = Table(title="PyTorch in this process", show_header=False)
    pytorch.add_column("what", ratio=2)
    pytorch.add_column("value", ratio=3, overflow="fold")
    pytorch.add_row("torch", d.torch or "not installed")
    pytorch.add_row("torch's own torch.cuda.cudart()", esc(d.torch_cudart))
    pytorch.add_row("hostreg's drop-in", esc(d.dropin))
    pytorch.add_row("torch.cuda.cudart() as PyTorch calls it now", esc(d.pytorch_cudart))
    console.print(pytorch)

    if d.backend_note:
        console.print(f"note: {esc(d.backend_note)}", highlight=False)
    if d.problems:
        console.print(f"[bold red]verdict: staging {d.staging_bytes:,} bytes would fail[/]")
        for p in d.problems:
            console.print(f"  - {esc(p)}", highlight=False)
    else:
        console.print(f"[bold green]verdict: staging {d.staging_bytes:,} bytes would work ({d.active} backend)[/]")
    for w in d.warnings:
        console.print(f"[bold yellow]warning:[/] {esc(w)}", highlight=False)
    if own_process:
        console.print(
            "(this is a process of its own: what your program does to torch, such as Ascend's transfer_to_npu or "
            "`import hostreg.auto`, shows when the program calls hostreg.doctor.report() after its setup)",
            highlight=False,
        )


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
