"""The ``hostreg`` command line.

``hostreg stage`` (the main job) stages a state dict into shared, page-locked memory
through PyTorch's own code path and prints what happened; with ``--save DIR`` it also saves
the staged dict as a DCP checkpoint, loads it back and verifies it. Exit codes: 0 success,
1 staging or the save failed or could not be verified (the message says why), 2 bad usage.

``hostreg doctor`` reports every backend (available or why not), the limits that decide
whether staging works, and a verdict. Exit codes: 0 staging would work, 1 it would not.

``hostreg verify DIR`` checks every byte of a DCP checkpoint against what was saved
(``verify.py``). Exit codes: 0 intact, 1 a problem found, 2 bad usage.

``hostreg bench`` times checkpoint saves and loads, cold and warm, against the disk's
``O_DIRECT`` ceiling (``bench.py``). Exit codes: 0 done, 1 a failure, 2 bad usage.

``hostreg --version`` prints the version; ``hostreg --cmakedir`` the folder of the CMake
package the wheel installs (``find_package(hostreg)`` with ``-Dhostreg_DIR=...``, as
``python -m nanobind --cmake_dir``), ``hostreg --includedir`` the folder of the C headers.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any


@contextlib.contextmanager
def _kept_for_life() -> Iterator[None]:
    """Runs the block (a command's imports of torch) with the garbage collector paused, then
    hides every object alive from it for the rest of the process (``gc.freeze``). torch's
    modules are ~300,000 objects that live until the process ends: collections during the
    import would walk them again and again (about 0.2 s of CPU here), and every full collection
    after it walks them all (about 0.15 s each): the stage job's own ``gc.collect()`` calls,
    which release what it staged, and the three the interpreter makes at exit. Objects made
    later are collected as before; the collector is left enabled or disabled as it was."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
    gc.freeze()


def esc(text: str) -> str:
    """``text`` printed as it is by rich (a path such as ``ck[/]`` is not markup)."""
    from rich.markup import escape

    return escape(text)


def _console(stderr: bool = False) -> Any:
    """A rich Console whose closed pipe (``hostreg doctor | head``) ends its output quietly:
    rich's own exits 1 there (``Console.on_broken_pipe``), hiding the command's verdict."""
    from rich.console import Console

    class QuietOnClosedPipe(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True  # nothing more is written
            stream = sys.stderr if stderr else sys.stdout
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())  # nor at exit

    return QuietOnClosedPipe(stderr=stderr)


def _needs_torch(command: str) -> bool:
    """True, having said how to get it, where torch cannot be imported (``command`` needs it)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        _console(stderr=True).print(
            f"[bold red]hostreg {command}[/] needs PyTorch, which is not installed here. Install any torch from 2.4 "
            "on (for a CPU-only one: pip install torch --index-url https://download.pytorch.org/whl/cpu), "
            "or pip install 'hostreg[torch]'. `hostreg doctor` works without it."
        )
        return True
    return False


def _stage(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    if _needs_torch("stage"):
        return 1
    with _kept_for_life():  # these bring torch in, and DCP where the job saves
        from . import models
        from . import stage as stage_job
        from .checkpoint import load_checkpoint

        if args.save:  # a torch without DCP fails in the save's own import, as it did before
            with contextlib.suppress(ImportError):
                import torch.distributed.checkpoint  # noqa: F401

    out = _console()
    err = _console(stderr=True)
    show = err.is_terminal if args.progress is None else args.progress
    bar = (
        Progress(
            TextColumn("{task.description:>8}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        )
        if show
        else contextlib.nullcontext()
    )
    tasks: dict[str, int] = {}

    def progress(phase: str, done: int, total: int) -> None:
        if not show:
            return
        if phase not in tasks:
            tasks[phase] = bar.add_task(phase, total=total)  # type: ignore[union-attr]
        bar.update(tasks[phase], completed=done)  # type: ignore[union-attr]

    import hostreg

    # The process's device for registrations on threads without a device context of their own
    # (AscendCL's are per thread; staging may run on such a thread): this command chooses it.
    if (code := hostreg.set_default_device(args.device)) != hostreg.cudaError.success:
        err.print(
            f"[bold red]hostreg stage: device {args.device}[/]: {code.name} ({int(code)}): {esc(hostreg.last_error().message)}",
            highlight=False,
            soft_wrap=True,
        )
        return 1
    try:
        with bar:
            t0 = time.perf_counter()
            if args.checkpoint:
                source = str(args.checkpoint)
                state_dict = load_checkpoint(args.checkpoint)
            else:
                source = f"embedded model {args.model}"
                state_dict = models.build(args.model).state_dict()
            load_s = time.perf_counter() - t0
            report = stage_job.stage_state_dict(state_dict, engine=args.engine, progress=progress, save_to=args.save)
    except stage_job.SaveError as e:
        err.print(f"[bold red]hostreg stage: save failed[/]\n{esc(str(e))}", highlight=False, soft_wrap=True)
        return 1
    except stage_job.StagingError as e:
        err.print(f"[bold red]hostreg stage: staging failed[/]\n{esc(str(e))}", highlight=False, soft_wrap=True)
        return 1

    gib = 2**30
    engines = {
        "hostreg": "hostreg (one shared arena, one registration)",
        "torch": "torch (_create_cpu_state_dict, share+pin)",
    }
    table = Table(title=f"hostreg stage: {esc(source)}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("backend", report.backend)
    table.add_row("engine", engines[report.engine])
    table.add_row("tensors (registered)", f"{report.tensors} ({report.pinned_tensors})")
    table.add_row("registrations", str(report.registrations))
    table.add_row("bytes staged", f"{report.bytes_staged:,} ({report.bytes_staged / gib:.3f} GiB)")
    table.add_row("bytes locked (VmLck rise)", f"{report.bytes_locked:,} ({report.bytes_locked / gib:.3f} GiB)")
    table.add_row("seconds to build/load source", f"{load_s:.2f}")
    table.add_row("seconds to create", f"{report.create_s:.2f}")
    table.add_row("copy GiB/s", f"{report.copy_gib_per_s:.2f}")
    table.add_row("values verified", "yes")
    table.add_row("unregistered on release", "yes" if report.released else "no")
    sv = report.saved
    if sv is not None:
        c = sv.ceiling
        table.add_section()
        table.add_row("checkpoint saved to", f"{esc(sv.directory)} ({sv.file_bytes:,} bytes of the checkpoint's files)")
        table.add_row("checkpoint I/O", "O_DIRECT" if sv.direct else "page cache (the filesystem refuses O_DIRECT)")
        table.add_row("save s (hostreg FileSystemWriter)", f"{sv.save_s:.2f}")
        table.add_row("save GiB/s (x disk ceiling)", f"{sv.save_bps / gib:.2f} ({sv.save_bps / c.write:.2f}x)")
        table.add_row("load s (hostreg FileSystemReader)", f"{sv.load_s:.2f}")
        table.add_row("load GiB/s (x disk ceiling)", f"{sv.load_bps / gib:.2f} ({sv.load_bps / c.read:.2f}x)")
        table.add_row("disk ceiling write / read GiB/s", f"{c.write / gib:.2f} / {c.read / gib:.2f}")
        table.add_row("ceiling measured by", esc(c.tool))
        table.add_row("values verified after load", "yes")
    out.print(table)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    import json

    from .. import doctor

    if args.bytes <= 0:
        print(f"hostreg doctor: --bytes must be > 0, got {args.bytes}", file=sys.stderr)
        return 2
    with _kept_for_life():
        d = doctor.diagnose(args.bytes)  # imports torch where it is installed
    problems = doctor.verdict(d)
    if args.json:
        try:
            print(json.dumps(doctor.to_json(d), indent=2), flush=True)
        except BrokenPipeError:  # the reader left: the verdict stands
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1 if problems else 0

    doctor.render(d, _console(), args.checkpoint_dir or [], own_process=True)
    return 1 if problems else 0


def build_parser() -> argparse.ArgumentParser:
    from .shapes import DEFAULT_MODEL, MODELS  # not .models: that imports torch

    parser = argparse.ArgumentParser(
        prog="hostreg", description="Page-locked host memory through cudaHostRegister, on any accelerator or none."
    )
    import hostreg

    parser.add_argument("--version", action="version", version=f"hostreg {hostreg.__version__}")
    parser.add_argument(
        "--cmakedir",
        action=_PrintPath,
        path="cmake",
        help="print the folder of hostreg's CMake package (hostregConfig.cmake) and exit",
    )
    parser.add_argument(
        "--includedir",
        action=_PrintPath,
        path="include",
        help="print the folder of hostreg's C headers (hostreg/hostreg.h) and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "stage",
        help="stage a state dict into shared, page-locked memory and verify it",
        description="Stage a state dict into shared, page-locked memory (hostreg's arena, or PyTorch's "
        "_create_cpu_state_dict(share_memory=True, pin_memory=True) through hostreg's drop-in), verify "
        "values and locking (VmLck), release it, and report.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--model", choices=list(MODELS), default=DEFAULT_MODEL, help="embedded model (default: %(default)s)"
    )
    src.add_argument("--checkpoint", metavar="PATH", help="a .safetensors or torch.save (.pt/.pth/.bin) state dict")
    p.add_argument(
        "--engine",
        choices=["hostreg", "torch"],
        default="hostreg",
        help="hostreg: one shared arena, one registration (default); torch: PyTorch's per-tensor path through the drop-in",
    )
    p.add_argument(
        "--device",
        type=_device,
        default=0,
        metavar="N",
        help="the device registrations are made for where the runtime's contexts are per thread (AscendCL: NPU N; "
        "default %(default)s); other backends use their runtime's own current device",
    )
    p.add_argument(
        "--save",
        metavar="DIR",
        type=_directory,
        help="also save the staged state dict as a DCP checkpoint in DIR (made if missing; a checkpoint there is "
        "replaced) with hostreg.torch.FileSystemWriter, load it back with FileSystemReader, verify every byte, and "
        "print both rates beside the disk's own O_DIRECT ceiling (fio when installed)",
    )
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when it is a terminal)",
    )
    p.set_defaults(func=_stage)

    from ..doctor import DEFAULT_BYTES

    d = sub.add_parser("doctor", help="report backends, limits and whether staging would work")
    d.add_argument("--json", action="store_true", help="print the report as JSON")
    d.add_argument(
        "--bytes",
        type=int,
        default=DEFAULT_BYTES,
        help="bytes to judge staging for (default: the embedded default model, %(default)s)",
    )
    d.add_argument(
        "--checkpoint-dir",
        action="append",
        metavar="DIR",
        help="say whether hostreg.torch.FileSystemWriter/Reader get O_DIRECT in DIR (repeatable)",
    )
    d.set_defaults(func=_doctor)
    from . import bench, verify

    verify.add_parser(sub)
    bench.add_parser(sub)
    return parser


class _PrintPath(argparse.Action):
    """``--cmakedir`` / ``--includedir``: prints the folder ``path`` of the installed package
    (what a wheel installs beside the extension) and exits 0; exits 1 naming it where this
    install has none (a source tree run in place, or a build without the C ABI's files)."""

    def __init__(self, option_strings: list[str], dest: str, path: str, help: str) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)
        self.path = path

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        import hostreg

        where = os.path.join(os.path.dirname(os.path.abspath(hostreg.__file__)), self.path)
        if not os.path.isdir(where):
            parser.exit(
                1,
                f"hostreg: no {where} in this install (the wheel installs it; `cmake --install` puts "
                "hostreg's CMake package and headers under its prefix instead)\n",
            )
        print(where)
        parser.exit(0)


def _device(text: str) -> int:
    """--device: an int from 0 to 2**31 - 1 (a device ordinal), else a usage error."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a device number: {text!r}") from None
    if not 0 <= n < 2**31:
        raise argparse.ArgumentTypeError(f"a device number is from 0 to {2**31 - 1}, got {n}")
    return n


def _directory(text: str) -> str:
    """--save: a non-empty path."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty directory name")
    return text


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:  # Ctrl-C: said in one line; whatever was staged is released on the way out
        print("hostreg: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `hostreg doctor --json | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
