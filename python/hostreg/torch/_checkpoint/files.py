"""Files of a checkpoint: opened for ``O_DIRECT`` where the file system allows it (said once
per directory where it does not), replaced without writing through hard links, made durable
with their directory; the C core's errors raised; what a transfer did (:class:`IoStats`)."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import os
import stat
import threading

from ..._core import last_error
from ..._errors import HostregError

_log = logging.getLogger("hostreg")

BLOCK = 4096  # HOSTREG_IO_BLOCK (include/hostreg/io.h)
MIN_DIRECT = 256 * 1024  # HOSTREG_IO_MIN_DIRECT
SUFFIX = ".distcp"  # DCP's DEFAULT_SUFFIX
METADATA = ".metadata"
_DCP_VERSION = "1.0.0"  # torch 2.13's CURRENT_DCP_VERSION; what its readers accept

# ---- Files -----------------------------------------------------------------------------------

_told_buffered: set[str] = set()
_told_lock = threading.Lock()


def _say_buffered(directory: str, err: OSError) -> None:
    with _told_lock:
        if directory in _told_buffered:
            return
        _told_buffered.add(directory)
    _log.warning(
        "hostreg: %s refuses O_DIRECT (%s; ramfs, tmpfs before Linux 6.6 and some network filesystems do): checkpoints there are "
        "written and read through the page cache",
        directory,
        os.strerror(err.errno or 0),
    )


def _open(path: str, flags: int, direct: bool) -> int:
    """Opens ``path`` with O_DIRECT where its filesystem allows, else without (said once per
    directory)."""
    flags |= os.O_CLOEXEC
    if direct:
        try:
            return os.open(path, flags | os.O_DIRECT, 0o644)
        except OSError as e:
            if e.errno != 22:  # EINVAL: this filesystem has no O_DIRECT
                raise
            _say_buffered(os.path.dirname(path) or ".", e)
    return os.open(path, flags, 0o644)


def _open_to_replace(path: str, direct: bool) -> int:
    """Opens ``path`` for writing a new file's bytes over whatever it held. An existing file of
    one link is written in place and cut to its new size by the write (``hostregFileWrite``
    truncates at its end): ``O_TRUNC`` would first free every block of it, about 0.25 s a GiB
    on ext4 (measured on this project's test machine), before the first byte is written. A
    file with other links (a hard-linked copy of an earlier checkpoint) is unlinked first, so
    that the copy keeps its bytes. Either way the file's old bytes are no checkpoint's once
    this rank writes: the coordinator removed ``.metadata`` before any rank wrote data."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        st = None
    if st is not None and (st.st_nlink > 1 or not stat.S_ISREG(st.st_mode)):
        os.unlink(path)
    return _open(path, os.O_WRONLY | os.O_CREAT, direct)


# ---- Threads ---------------------------------------------------------------------------------

SOLID_THREADS = 8  # requests in flight on a solid-state or virtual disk
SPINNING_THREADS = 2  # on a rotational one (seeks between requests cost more than queueing gains)
_threads_of: dict[int, int] = {}


def check_threads(thread_count: object) -> None:
    """ValueError unless ``thread_count`` is None (chosen per disk) or an int >= 1."""
    if thread_count is None:
        return
    if isinstance(thread_count, bool) or not isinstance(thread_count, int) or thread_count < 1:
        raise ValueError(f"thread_count must be an int >= 1 or None (chosen per disk), got {thread_count!r}")


def threads_for(directory: str, thread_count: int | None) -> int:
    """``thread_count``, or where it is None the default for the disk under ``directory``:
    :data:`SPINNING_THREADS` where the kernel says the block device is rotational
    (``/sys/dev/block/MAJ:MIN/queue/rotational``, of the partition's disk for a partition),
    else :data:`SOLID_THREADS` (also for filesystems with no block device: tmpfs, overlay,
    network). Measured on this project's test VM (docs/checkpoint.md): with 4 threads a save of
    a few large tensors took 1.6-2x the disk's ``O_DIRECT`` ceiling, with 8 threads 1.09x; many
    small tensors took the same time with 2, 4 or 8."""
    if thread_count is not None:
        return thread_count
    try:
        dev = os.stat(directory).st_dev
    except OSError:
        return SOLID_THREADS
    got = _threads_of.get(dev)
    if got is None:
        got = SOLID_THREADS
        base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
        for q in (f"{base}/queue/rotational", f"{base}/../queue/rotational"):
            try:
                with open(q) as f:
                    got = SPINNING_THREADS if f.read().strip() == "1" else SOLID_THREADS
                break
            except OSError:
                continue
        _threads_of[dev] = got
    return got


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _raise_io(what: str) -> None:
    err = last_error()
    if err.native > 0:
        raise OSError(err.native, f"{what}: {err.message}")
    raise HostregError(f"{what}: {err.code}: {err.message}")


def _address(buf: bytearray) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf)) if len(buf) else 0


@dataclasses.dataclass
class IoStats:
    """What the last transfer of a writer or reader did (bytes, requests, O_DIRECT or not)."""

    direct_bytes: int = 0
    bounced_bytes: int = 0
    requests: int = 0
    direct: bool = False
    copied_bytes: int = 0  # made contiguous or moved to the CPU in Python before writing

    def add(self, got: tuple[int, int, int, int, bool]) -> None:
        self.direct_bytes += got[1]
        self.bounced_bytes += got[2]
        self.requests += got[3]
        self.direct = got[4]
