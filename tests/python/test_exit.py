"""Interpreter exit with live registrations: PyTorch's finalizers unregister through the
drop-in during shutdown, with nothing printed and exit code 0."""

from __future__ import annotations

import textwrap

from conftest import run_python

SCRIPT = textwrap.dedent(
    """
    import weakref, torch, hostreg, hostreg.torch
    from torch.distributed._state_dict_utils import _create_cpu_state_dict, _copy_state_dict
    # At exit, weakref.finalize runs pending finalizers newest first: this one, made before
    # PyTorch's (which unregister the tensors), reports after them.
    class Sentinel: pass
    keep = Sentinel()
    weakref.finalize(keep, lambda: print("left", hostreg.stats().registrations, hostreg.locked_bytes()))
    hostreg.torch.install()
    src = {f"t{i}": torch.randn(1000 + i) for i in range(20)}
    cpu = _create_cpu_state_dict(src, pin_memory=True, share_memory=True)
    _copy_state_dict(src, cpu)
    assert hostreg.stats().registrations == 20
    assert hostreg.locked_bytes() >= sum(t.nbytes for t in cpu.values())
    print("staged")
    """
)


def test_exit_with_live_registrations_is_silent_and_unregisters():
    r = run_python(SCRIPT)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert r.stdout.splitlines() == ["staged", "left 0 0"]
