"""What the OS says about this process's locked memory (Linux ``/proc``)."""

from __future__ import annotations


def locked_bytes(pid: int | str = "self") -> int:
    """Bytes of memory the process has locked, from ``VmLck`` in ``/proc/<pid>/status``.

    This is the kernel's own count, independent of hostreg's bookkeeping: tests and
    ``hostreg stage`` use it to prove that a registration really page-locked memory.
    Raises ``OSError`` if the status file cannot be read, ``RuntimeError`` if it has no
    ``VmLck`` line.
    """
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmLck:"):
                value, unit = line.split()[1:3]
                assert unit == "kB", line
                return int(value) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmLck line")
