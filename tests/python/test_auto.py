"""Zero-code activation: ``import hostreg.auto`` and ``HOSTREG_AUTO_INSTALL=1`` (the .pth hook),
alone and beside Ascend's ``transfer_to_npu``, reproduced without Ascend hardware.

``torch_npu.contrib.transfer_to_npu`` redirects ``torch.cuda.is_initialized`` to the NPU, so
``torch.cuda._lazy_init`` returns early and ``torch.cuda.cudart()`` returns ``None``
(docs/pytorch.md). ``NPU_LIKE`` below does exactly that.
"""

from __future__ import annotations

import sysconfig
import textwrap
from pathlib import Path

import pytest
from conftest import run_python

NPU_LIKE = "import torch, torch.cuda; torch.cuda.is_initialized = lambda: True  # as transfer_to_npu does\n"

SCENARIO = textwrap.dedent(
    """
    import gc, torch, hostreg
    from torch.distributed._state_dict_utils import _create_cpu_state_dict, _copy_state_dict
    src = {"w": torch.arange(10.0), "step": torch.tensor(7.0)}
    cpu = _create_cpu_state_dict(src, share_memory=True, pin_memory=True)
    _copy_state_dict(src, cpu)
    assert torch.equal(cpu["w"], src["w"]) and hostreg.stats().registrations == 1
    del cpu; gc.collect()
    print("scenario ok", type(torch.cuda.cudart()).__name__, hostreg.stats().registrations)
    """
)


def run(code: str, **env: str):
    return run_python(code, env={"HOSTREG_AUTO_INSTALL": "", **env})


def test_the_npu_like_state_reproduces_the_failure():
    r = run(NPU_LIKE + "print(torch.cuda.cudart())\n" + SCENARIO)
    assert r.stdout.startswith("None")
    assert "'NoneType' object has no attribute 'cudaHostRegister'" in r.stderr


@pytest.mark.parametrize(
    "order",
    [
        "import hostreg.auto\n" + NPU_LIKE,  # hostreg first: torch is imported after the hook
        NPU_LIKE + "import hostreg.auto\n",  # transfer_to_npu first
        "import torch\nimport hostreg.auto\n" + NPU_LIKE,
    ],
    ids=["hostreg-then-npu", "npu-then-hostreg", "torch-hostreg-npu"],
)
def test_import_hostreg_auto_beside_transfer_to_npu(order: str):
    r = run(order + SCENARIO)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == "scenario ok CudaRuntime 0"


def test_import_hostreg_auto_does_not_import_torch():
    r = run("import sys, hostreg.auto; print('torch' in sys.modules)")
    assert r.stdout.strip() == "False"


def test_pth_hook_is_installed_and_inert_by_default():
    pth = Path(sysconfig.get_paths()["purelib"]) / "hostreg-auto.pth"
    assert pth.is_file(), "the wheel puts hostreg-auto.pth in site-packages"
    r = run("import sys; print('hostreg' in sys.modules, 'torch' in sys.modules)")
    assert r.stdout.strip() == "False False"


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_pth_hook_activates_an_unmodified_script(value: str):
    script = (
        "import sys; assert 'torch' not in sys.modules\n"
        + NPU_LIKE
        + SCENARIO.replace("import gc, torch, hostreg", "import gc, torch\nimport hostreg")
    )
    r = run(script, HOSTREG_AUTO_INSTALL=value)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == "scenario ok CudaRuntime 0"


def test_pth_hook_then_hostreg_torch_imported_before_torch():
    # hostreg.torch imports torch; the hook then fires while hostreg.torch is half-imported.
    r = run(
        "import hostreg.torch, torch; print(torch.cuda.cudart() is hostreg.cudart(), hostreg.torch.is_installed())",
        HOSTREG_AUTO_INSTALL="1",
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.strip() == "True True"


def test_two_hooks_do_not_recurse():
    r = run(
        "import importlib, hostreg.auto; importlib.reload(hostreg.auto); import torch, hostreg; print(torch.cuda.cudart() is hostreg.cudart())"
    )
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr
