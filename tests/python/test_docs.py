"""The code the README and docs show runs as written.

Every ```python block of README.md and docs/*.md runs in a fresh interpreter, in an empty
directory, after a prelude that defines the names the docs leave to the reader's program
(``model``, ``optimizer``, ``state_dict``, ``steps``, ``train_step``) and starts a one-rank
gloo process group; a block that raises fails its test. The C program of docs/c-api.md is
built with that page's C-only CMake project against the installed C package that
``scripts/test-install`` makes, and run. The shell blocks are the setup and test commands
that ``.ci/run`` itself runs, or build commands that ``scripts/test-install`` runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CHILD_SITE, REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# What the docs' snippets take from the reader's program: a small model with optimizer
# state, its state dict, a loop's length and step, and a process group (one rank, gloo).
PRELUDE = """
import os, tempfile
import torch, torch.distributed as dist
dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + tempfile.mktemp(dir=os.getcwd()))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.AdamW(model.parameters())

def train_step():
    optimizer.zero_grad()
    model(torch.randn(2, 16)).sum().backward()
    optimizer.step()

train_step()
state_dict = model.state_dict()
steps = 201
"""

# Each block ends by leaving nothing behind it: the process group goes, and a leftover
# registration or lock fails it (the drop-in's and the stager's must be released by then).
EPILOGUE = """
import gc, hostreg
if dist.is_initialized():
    dist.destroy_process_group()
for _name in [n for n in globals() if not n.startswith("_") and n not in ("gc", "hostreg")]:
    del globals()[_name]  # what the snippet made: freeing it must release what it registered
gc.collect()
print("REGISTRATIONS", hostreg.stats().registrations)
"""


def blocks(path: Path, language: str) -> list[tuple[int, str]]:
    """(line number, code) of every fenced ```language block of ``path``."""
    out, code, start = [], None, 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if code is None and line.strip() == f"```{language}":
            code, start = [], number
        elif code is not None and line.strip() == "```":
            out.append((start, "\n".join(code)))
            code = None
        elif code is not None:
            code.append(line)
    return out


PYTHON_BLOCKS = [(p, n, code) for p in DOCS for n, code in blocks(p, "python")]


def test_the_docs_have_the_blocks_these_tests_run():
    # A renamed fence (```py) would silently drop a block from the tests below.
    assert len(PYTHON_BLOCKS) >= 12, [(p.name, n) for p, n, _ in PYTHON_BLOCKS]
    for p in DOCS:
        fences = re.findall(r"^```(\w*)$", p.read_text(encoding="utf-8"), flags=re.M)
        assert set(fences) <= {"python", "sh", "c", "cmake", "text", ""}, (p.name, set(fences))


@pytest.mark.parametrize("path, line, code", PYTHON_BLOCKS, ids=[f"{p.name}:{n}" for p, n, _ in PYTHON_BLOCKS])
def test_python_block_runs(path: Path, line: int, code: str, tmp_path: Path):
    script = tmp_path / "snippet.py"
    script.write_text(PRELUDE + "\n# --- " + f"{path.name}:{line}\n" + code + "\n" + EPILOGUE, encoding="utf-8")
    env = {**os.environ, "HOSTREG_BACKEND": "posix", "PYTHONPATH": CHILD_SITE}  # not tests/: only what a reader has
    r = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )
    assert r.returncode == 0, f"{path.name}:{line} failed:\n{r.stderr[-4000:]}"
    assert "REGISTRATIONS 0" in r.stdout, f"{path.name}:{line} left registrations behind:\n{r.stdout[-2000:]}"


@pytest.mark.parametrize("package", ["cmake --install", "wheel"])
def test_the_c_program_builds_with_the_c_only_cmake_project_and_runs(tmp_path: Path, package: str):
    """Against the prefix ``cmake --install`` filled (scripts/test-install), and against the
    CMake package the installed wheel carries (``hostreg --cmakedir``)."""
    import hostreg

    if package == "wheel":
        cmakedir = Path(hostreg.__file__).parent / "cmake"
        found = f"-Dhostreg_DIR={cmakedir}"
        missing = None if (cmakedir / "hostregConfig.cmake").is_file() else f"{cmakedir} is missing (a wheel has it)"
    else:
        prefix = REPO / "build/install-check/prefix"
        found = f"-DCMAKE_PREFIX_PATH={prefix}"
        missing = (
            None
            if (prefix / "include/hostreg/hostreg.h").is_file()
            else (f"{prefix} is missing: scripts/test-install makes it (scripts/test runs it before pytest)")
        )
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing)
        pytest.skip(missing)
    page = REPO / "docs" / "c-api.md"
    ((c_line, c_code),) = blocks(page, "c")
    ((cm_line, cmake_code),) = blocks(page, "cmake")
    (tmp_path / "app.c").write_text(c_code + "\n", encoding="utf-8")
    (tmp_path / "CMakeLists.txt").write_text(cmake_code + "\n", encoding="utf-8")
    cmake = shutil.which("cmake", path=str(Path(sys.executable).parent)) or "cmake"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    for args in (
        [
            "-S",
            str(tmp_path),
            "-B",
            str(tmp_path / "build"),
            found,
            "-DCMAKE_C_FLAGS=-std=c99 -pedantic -Wall -Wextra -Werror",
        ],
        ["--build", str(tmp_path / "build")],
    ):
        r = subprocess.run([cmake, *args], capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, (
            f"c-api.md:{cm_line} / :{c_line}: cmake {args[0]} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}"
        )
    r = subprocess.run(
        [str(tmp_path / "build/app")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "HOSTREG_BACKEND": "posix"},
    )
    assert r.returncode == 0, r.stderr
    assert re.fullmatch(r"hostreg \d+\.\d+\.\d+: 1048576 bytes page-locked by posix\n", r.stdout), r.stdout
