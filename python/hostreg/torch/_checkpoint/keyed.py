"""Objects made once per structure that travel between ranks as a token and their bytes.

DCP exchanges plans and write results between ranks by pickling them
(``torch.distributed.gather_object`` / ``scatter_object_list``, in ``_DistWrapper``). A plan of
65,536 items is about as many Python objects, pickled on one side and unpickled on the other
at every save, although it is the same plan as the save before. :class:`Keyed` objects are
pickled as ``(token, bytes)``: the bytes are made once per object (on its first exchange), and
the receiving rank rebuilds the object from them only the first time it sees the token; later
it hands out the object it rebuilt then, the same one each time. So the bytes still travel
(every rank can always rebuild what it is sent: no rank relies on what another rank
remembers), but no save after the first pays per item in Python for them.

A token names one immutable object's content (``secrets.token_hex``: 128 random bits); an
object is immutable from the moment it gets a token (plans, items and results are never
changed in place by DCP, by its planners or by hostreg's writer).
"""

from __future__ import annotations

import pickle
import secrets
import threading
from collections import OrderedDict
from typing import Any

_KEEP = 8  # tokens remembered per table (sent and received): a few structures in flight

_lock = threading.Lock()
_sent: OrderedDict[str, tuple[Any, bytes | None]] = OrderedDict()  # token -> (object, its bytes once made)
_received: OrderedDict[str, Any] = OrderedDict()  # token -> the object rebuilt from its bytes


def _remember(table: OrderedDict, token: str, value: Any) -> None:
    table[token] = value
    table.move_to_end(token)
    while len(table) > _KEEP:
        table.popitem(last=False)


def new_token(obj: Any) -> str:
    """A token for ``obj`` (which must not change from now on), remembered for sending."""
    token = secrets.token_hex(16)
    with _lock:
        _remember(_sent, token, (obj, None))
    return token


def sent(token: str | None) -> Any:
    """The object this process gave ``token`` to, or None when it is not (or no longer) remembered."""
    if token is None:
        return None
    with _lock:
        got = _sent.get(token)
    return None if got is None else got[0]


def blob(token: str) -> bytes:
    """The pickled bytes of the object of ``token`` (made on the first call), for :func:`rebuild`.
    KeyError when ``token`` is no longer remembered (check with :func:`sent` first)."""
    with _lock:
        obj, made = _sent[token]
    if made is None:
        made = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        with _lock:
            if token in _sent:
                _sent[token] = (obj, made)
    return made


def rebuild(token: str, blob: bytes) -> Any:
    """The object ``token`` names: the one rebuilt from ``blob`` the first time this process saw
    ``token`` (the same object each time), else rebuilt now. Also an object this process sent
    itself under that token (a rank that gathers its own plan)."""
    with _lock:
        got = _received.get(token)
        if got is None:
            sent = _sent.get(token)
            got = None if sent is None else sent[0]
        if got is not None:
            return got
    obj = pickle.loads(blob)  # DCP's own exchange: the peer's bytes are unpickled there as well
    with _lock:
        _remember(_received, token, obj)
    return obj


def clear() -> None:
    """Forget every token (objects already handed out stay valid)."""
    with _lock:
        _sent.clear()
        _received.clear()
