"""The package is typed (py.typed, generated stubs for the extension, mypy passes) and says
one version, written in one place."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO

import hostreg
from hostreg import _hostreg


def test_stubs_cover_the_extension():
    pkg = Path(hostreg.__file__).parent
    assert (pkg / "py.typed").is_file()
    stub = (pkg / "_hostreg.pyi").read_text()
    public = [n for n in dir(_hostreg) if not n.startswith("_")]

    def declared(n: str) -> bool:  # functions, types, constants
        return f"def {n}(" in stub or f"class {n}" in stub or f"\n{n}: " in stub

    assert public and all(declared(n) for n in public), (
        f"stubs are out of date: {[n for n in public if not declared(n)]}"
    )


def test_mypy_passes_on_the_installed_package():
    r = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"), "-p", "hostreg"],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout


def test_the_version_is_written_in_one_place():
    # CMakeLists.txt's project() is the source: the C library reports it, the Python package
    # takes it from the library, the wheel's metadata from CMakeLists.txt (scikit-build-core's
    # regex provider), and scripts/test-install reads it there too.
    import importlib.metadata
    import re

    written = re.search(r"project\(hostreg VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text()).group(1)
    assert hostreg.__version__ == _hostreg.version() == importlib.metadata.version("hostreg") == written
    literal = re.compile(re.escape(written) + r"\b")
    for path in [REPO / "pyproject.toml", REPO / "python/hostreg/__init__.py", REPO / "scripts/test-install"]:
        assert not literal.search(path.read_text()), f"{path.name} writes the version {written} again"


def test_dir_of_hostreg_torch_lists_all_it_exports_without_importing_dcp():
    """``dir(hostreg.torch)`` names every name of ``__all__``, the checkpoint classes (loaded
    on first use) included, and asking does not import DCP."""
    code = (
        "import sys, hostreg.torch as ht; d = dir(ht); "
        "print(sorted(set(ht.__all__) - set(d)), 'torch.distributed.checkpoint' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "False"]
