"""DCP save planner that plans once per state-dict structure (docs/planning.md).

A training job saves the same structure every time, and DCP's ``DefaultSavePlanner`` redoes
everything per item at every save: it flattens the state dict, makes a ``WriteItem`` per
tensor (local plan), gathers the plans, deduplicates, rewrites index hints and validates them
(global plan), and builds ``Metadata``; about 70 us an item in torch 2.13. :class:`SavePlanner`
does the same the first time it sees a structure (the flattening and two steps of the global
plan made faster, with DCP's results: docs/planning.md), and on a
save whose structure is one it planned before, it hands out what it made then:

- the flattened state dict is rebuilt from the spec (``_tree``) without DCP's traversal;
- the local plan is the one made then (same object: its items are not made again);
- the coordinator's global plan and ``Metadata`` are the ones made then, when every rank's
  plan is one it was made from (each plan names its content by a token, ``keyed.py``);
- :meth:`resolve_all` gives the writer every item's data at once.

What counts as the structure (the key): the containers, their keys (with their types where
they are not all ``str``), the leaf kinds (``_tree``'s spec); per tensor its dtype, shape,
strides, device, ``requires_grad``, ``is_pinned()``, conjugate and negative bits, and for a
DTensor its mesh, placements, global shape and strides (its local shard's place follows from
them and the rank); the planner's own settings and class; and for the global plan, every
rank's plan (so the world size, the rank layout and a change on any one rank). Anything the
key cannot describe (a ShardedTensor, a tensor subclass other than DTensor, a ``Mapping``
that is not a ``dict``, an object with ``__create_write_items__``) is planned by DCP's code
at every save, as without this class. torch's own ``enable_plan_caching`` is not used: its
cache is one slot per class name, shared by every instance, and keyed on the items alone
(a change of dtype or nesting, or of the world size, reuses a plan that no longer fits).
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint import default_planner as _dcp_planner
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType

from .. import _issued, _tree
from .._collector import collector_paused
from .._dtensor import dtensor_type, placement_of
from .._sources import _views
from . import keyed
from .global_plan import global_save_plan, merged_planner_data
from .load_planner import _flat


@dataclasses.dataclass(frozen=True)
class KeyedSavePlan(SavePlan):
    """A ``SavePlan`` whose items and planner data are named by ``token`` (``keyed.py``): they
    travel between ranks as the token and their bytes, made once; DCP's code and writers see
    an ordinary ``SavePlan`` (``dataclasses.replace`` keeps the token)."""

    token: str | None = None

    def __reduce__(self) -> Any:
        rest = _others(self)
        body = keyed.sent(self.token)
        if body is None or body[0] is not self.items or body[1] is not self.planner_data:
            # Not (or no longer) what the token names: a writer replaced the items. As it is.
            return (_plain_plan, (self.items, self.planner_data, rest))
        token: str = self.token  # type: ignore[assignment]  # not None: keyed.sent found it
        return (_rebuild_plan, (token, keyed.blob(token), rest))


def _others(plan: SavePlan) -> dict[str, Any]:
    """``plan``'s fields but its items, planner data and token (``usable`` exists from torch
    2.6 on, ``storage_data`` in every version)."""
    return {
        f.name: getattr(plan, f.name) for f in dataclasses.fields(SavePlan) if f.name not in ("items", "planner_data")
    }


def _plain_plan(items: list, planner_data: Any, rest: dict[str, Any]) -> SavePlan:
    return SavePlan(items=items, planner_data=planner_data, **rest)


def _rebuild_plan(token: str, blob: bytes, rest: dict[str, Any]) -> KeyedSavePlan:
    items, planner_data = keyed.rebuild(token, blob)
    return KeyedSavePlan(items=items, planner_data=planner_data, token=token, **rest)


def _keyed(plan: SavePlan) -> KeyedSavePlan:
    """``plan`` with a new token naming its items and planner data (from now on unchanged)."""
    token = keyed.new_token((plan.items, plan.planner_data))
    return KeyedSavePlan(items=plan.items, planner_data=plan.planner_data, token=token, **_others(plan))


# ---- the structure of a state dict ------------------------------------------------------------


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def _columns(tensors: list[torch.Tensor]) -> tuple | None:
    """What a plan depends on per tensor (the module docstring's list), one list per property;
    None when a tensor is of a kind the key cannot describe."""
    try:
        return _read_columns(tensors)
    except (RuntimeError, NotImplementedError):  # no strides (sparse, mkldnn, nested): not described
        return None


def _read_columns(tensors: list[torch.Tensor]) -> tuple | None:
    plain = torch.Tensor
    types = set(map(type, tensors))
    dt = dtensor_type()
    if types <= {plain}:
        locals_, placed = tensors, None
    elif dt is not None and types <= {plain, dt}:
        locals_ = [t._local_tensor if type(t) is dt else t for t in tensors]  # type: ignore[attr-defined]
        if not set(map(type, locals_)) <= {plain}:
            return None
        placed = [placement_of(t, loc) if loc is not t else None for t, loc in zip(tensors, locals_)]
    else:
        return None
    return (
        *_views(locals_),  # dtypes, shapes, strides, devices
        list(map(plain.is_pinned, locals_)),
        list(map(plain.is_conj, locals_)),
        list(map(plain.is_neg, locals_)),
        list(map(_REQUIRES_GRAD, tensors)),
        placed,
    )


def _probe(state_dict: Any) -> tuple[tuple, list[torch.Tensor], list[Any]] | None:
    """(key without the planner's settings, tensors, other values) of ``state_dict``, or None
    where DCP's flattening could differ for an equal key (see the module docstring)."""
    tensors, values, spec = _tree.flatten(state_dict)
    for v in values:
        if isinstance(v, Mapping) or hasattr(v, "__create_write_items__"):
            return None
    slot = _issued.owner_of(spec, tensors)  # a Stager's: the properties are its slot's (_issued.py)
    if slot is not None and any(map(_REQUIRES_GRAD, tensors)):
        slot = None  # requires_grad_() on a staged tensor (handed out without): read them all
    if slot is not None:
        if slot.plan_columns is None:
            slot.plan_columns = _columns(tensors)
        cols = slot.plan_columns
    else:
        cols = _columns(tensors)
    if cols is None:
        return None
    return (spec, cols), tensors, values


def _dcp_paths(spec: tuple, prefix: tuple, raw: tuple, tensors: list[tuple], values: list[tuple], nodes: dict) -> None:
    """The path DCP's ``flatten_state_dict`` gives each leaf (dict keys as ``str``, list and
    tuple positions as ``int``), tensors and other values apart, in ``_tree``'s order; and in
    ``nodes``, each container's DCP path -> its path of real keys (``raw``: a dict key ``0``
    is ``"0"`` to DCP, which cannot find it again by that)."""
    kind = spec[0]
    if kind == "T":
        tensors.append(prefix)
    elif kind == "V":
        values.append(prefix)
    else:
        nodes[prefix] = raw
        if kind == "D":
            if spec[3] is _tree._tensors(len(spec[3])):  # a dict of tensors: no frame per tensor
                tensors += [(*prefix, str(k)) for k in spec[2]]
                return
            for k, c in zip(spec[2], spec[3]):
                _dcp_paths(c, (*prefix, str(k)), (*raw, k), tensors, values, nodes)
        else:
            for i, c in enumerate(spec[-1]):
                _dcp_paths(c, (*prefix, i), (*raw, i), tensors, values, nodes)


def _get(obj: Any, raw: tuple) -> Any:
    """The value at the path of real keys ``raw`` (from :func:`_dcp_paths`)."""
    for k in raw:
        obj = obj[k]
    return obj


class _Entry:
    """One structure's local plan on this rank: how to rebuild DCP's flattened state dict from
    ``_tree``'s leaves (``pick``: each flattened value's index in tensors + values; ``others``:
    the flattened values that are containers to DCP, a list of numbers or a tuple, taken by
    their path), its mappings, and the plan."""

    __slots__ = ("fqns", "pick", "others", "mappings", "plan", "positions")

    def __init__(
        self,
        fqns: list[str] | None,
        pick: list[int],
        others: list[tuple[int, tuple]],
        mappings: Any,
        plan: KeyedSavePlan,
    ) -> None:
        self.fqns, self.pick, self.others, self.mappings, self.plan = fqns, pick, others, mappings, plan
        self.positions: tuple | None = None  # (items, _positions() of them)

    @staticmethod
    def build(
        spec: tuple,
        state: Any,
        tensors: list,
        values: list,
        flat: dict,
        mappings: Any,
        plan: SavePlan,
        flattened: bool,
    ) -> _Entry | None:
        """The entry of a structure (``state``, its spec, tensors and values) DCP has just
        flattened into ``flat`` and planned; None when ``flat`` is not made of the leaves and
        containers the spec says (then nothing is cached)."""
        if not flattened:
            return _Entry(None, [], [], mappings, _keyed(plan))
        tpaths: list[tuple] = []
        vpaths: list[tuple] = []
        nodes: dict[tuple, tuple] = {}
        _dcp_paths(spec, (), (), tpaths, vpaths, nodes)
        where = {p: i for i, p in enumerate(tpaths)}
        where.update((p, len(tensors) + i) for i, p in enumerate(vpaths))
        combined = [*tensors, *values]
        fqns: list[str] = []
        pick: list[int] = []
        others: list[tuple[int, tuple]] = []
        for fqn, value in flat.items():
            i = where.get(mappings[fqn])
            if i is None:  # a container DCP does not enter: taken by its path at each save
                raw = nodes.get(mappings[fqn])
                try:
                    if raw is None or _get(state, raw) is not value:
                        return None
                except (KeyError, IndexError, TypeError):
                    return None
                others.append((len(pick), raw))
                i = -1
            elif combined[i] is not value:
                return None
            fqns.append(fqn)
            pick.append(i)
        return _Entry(fqns, pick, others, mappings, _keyed(plan))

    def flat(self, state_dict: Any, tensors: list, values: list) -> tuple[dict, list]:
        """DCP's flattened state dict of ``state_dict`` (whose leaves are ``tensors`` and
        ``values``), and its values in order."""
        if self.fqns is None:
            return state_dict, []
        combined = [*tensors, *values, None]  # -1: a placeholder for the others
        leaves = list(map(combined.__getitem__, self.pick))
        for at, raw in self.others:
            leaves[at] = _get(state_dict, raw)
        return dict(zip(self.fqns, leaves)), leaves


def _positions(entry: _Entry, items: list, leaves: list) -> tuple[list[int] | None, list[int]]:
    """Where each item's value is among the flattened values, and which items are resolved
    DCP's way (not a plain tensor written whole); the same for every save of the structure,
    whose key fixes each leaf's kind."""
    at = {fqn: i for i, fqn in enumerate(entry.fqns or ())}
    positions = [at.get(item.index.fqn, -1) for item in items]
    if -1 in positions:
        return None, []
    plain, whole = torch.Tensor, WriteItemType.TENSOR
    slow = [
        i for i, (item, p) in enumerate(zip(items, positions)) if item.type != whole or type(leaves[p]) is not plain
    ]
    return positions, slow


class _Global:
    """The coordinator's global plan and metadata for one list of local plans."""

    __slots__ = ("plans", "metadata", "sources")

    def __init__(self, sources: list[SavePlan], plans: list[SavePlan], metadata: Any) -> None:
        self.sources, self.plans, self.metadata = sources, plans, metadata

    def fits(self, all_plans: list[SavePlan]) -> bool:
        return len(all_plans) == len(self.sources) and all(
            type(p) is KeyedSavePlan
            and p.token == q.token
            and p.items is q.items
            and p.planner_data is q.planner_data
            and _others(p) == _others(q)
            for p, q in zip(all_plans, self.sources)
        )


_KEEP = 4  # structures remembered per process (local plans; global plans)
_lock = threading.Lock()
_entries: OrderedDict[tuple, tuple[tuple, _Entry]] = OrderedDict()  # (settings, spec) -> (columns, entry)
_globals: OrderedDict[tuple, _Global] = OrderedDict()


def clear_plan_cache() -> None:
    """Forget every plan hostreg's planners remember in this process (they plan anew)."""
    with _lock:
        _entries.clear()
        _globals.clear()


def _remember(table: OrderedDict, key: Any, value: Any) -> None:
    with _lock:
        table[key] = value
        table.move_to_end(key)
        while len(table) > _KEEP:
            table.popitem(last=False)


_DEFAULT_ARGS = set(inspect.signature(DefaultSavePlanner.__init__).parameters)


class SavePlanner(DefaultSavePlanner):
    """DCP's ``DefaultSavePlanner`` that plans once per state-dict structure.

    ``dcp.save(sd, ..., planner=hostreg.torch.SavePlanner())`` (and ``dcp.async_save``): the
    first save of a structure is planned as DCP's own code plans it; a later save of the same structure
    (see the module docstring for what that is), by any instance of this class in the process,
    reuses the flattening, the local plan, and on the coordinator the global plan and
    ``Metadata``, unless any rank's plan changed. It writes exactly what ``DefaultSavePlanner``
    writes, works with DCP's own ``FileSystemWriter`` and any other storage writer, and with
    hostreg's :class:`FileSystemWriter` lets the writer reuse its file layout too.

    Args: those of ``DefaultSavePlanner`` (torch 2.13), in its order. ``enable_plan_caching``
    is accepted and has no effect: this class's own caching replaces torch's (which is keyed
    by class name alone; see docs/planning.md). ``cache_plans=False`` (keyword only) plans
    every save as ``DefaultSavePlanner`` does.

    The process remembers the last 4 structures (with the writer's layout, about 4 KB a tensor:
    256 MiB for 65,536 tensors, docs/planning.md);
    :func:`hostreg.torch.clear_plan_cache` forgets them.
    """

    def __init__(
        self,
        flatten_state_dict: bool = True,
        flatten_sharded_tensors: bool = True,
        dedup_replicated_tensors: bool | None = None,
        dedup_save_to_lowest_rank: bool = False,
        enable_plan_caching: bool = False,
        *,
        cache_plans: bool = True,
    ) -> None:
        kw: dict[str, Any] = {
            "flatten_state_dict": flatten_state_dict,
            "flatten_sharded_tensors": flatten_sharded_tensors,
            "dedup_replicated_tensors": dedup_replicated_tensors,
            "dedup_save_to_lowest_rank": dedup_save_to_lowest_rank,
        }
        super().__init__(**{k: v for k, v in kw.items() if k in _DEFAULT_ARGS})
        self._enable_plan_caching = False  # torch's own (torch >= 2.6); see the class docstring
        self.cache_plans = cache_plans
        self._settings = (type(self), flatten_state_dict, flatten_sharded_tensors, dedup_save_to_lowest_rank)
        self._entry: _Entry | None = None  # this save's, once known
        self._leaves: list[Any] = []
        self._probe: tuple | None = None

    def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
        # Several objects per item (the probe's columns, DCP's flattening): no full collection
        # of Python's cyclic collector over them all meanwhile (docs/planning.md).
        with collector_paused():
            self._set_up(state_dict, storage_meta, is_coordinator)

    def _set_up(self, state_dict: Any, storage_meta: Any, is_coordinator: bool) -> None:
        self.is_coordinator = is_coordinator
        self._entry, self._leaves, self._probe = None, [], None
        probe = _probe(state_dict) if self.cache_plans else None
        if probe is not None:
            (spec, cols), tensors, values = probe
            key = (self._settings, spec)  # hashed; the columns are compared
            with _lock:
                got = _entries.get(key)
            entry = got[1] if got is not None and got[0] == cols else None
            if entry is not None:
                self.state_dict, self._leaves = entry.flat(state_dict, probe[1], probe[2])
                self.mappings = entry.mappings
                self._entry = entry
                return
            self._probe = (key, cols, tensors, values, state_dict)
        flat = _flat(state_dict) if self.flatten_state_dict and self.flatten_sharded_tensors else None
        if flat is None:
            super().set_up_planner(state_dict, storage_meta=storage_meta, is_coordinator=is_coordinator)
            return
        # What DCP's set-up makes of dicts of str keys, plain tensors and scalars: its
        # flattening (made by one walk, load_planner._flat) copied by _flatten_sharded_tensors
        # (no ShardedTensor: the same items).
        self.state_dict, paths = flat
        self.mappings = dict(paths.items())
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> SavePlan:
        if self._entry is not None:
            self.plan = self._entry.plan
            return self.plan
        with collector_paused():  # DCP's plan and the entry: several objects per item
            return self._plan_locally()

    def _plan_locally(self) -> SavePlan:
        plan = super().create_local_plan()
        if self._probe is not None:
            key, cols, tensors, values, state = self._probe
            self._probe = None
            entry = _Entry.build(
                key[1], state, tensors, values, self.state_dict, self.mappings, plan, self.flatten_state_dict
            )
            if entry is not None:
                _remember(_entries, key, (cols, entry))
                self._entry = entry
                self._leaves = list(self.state_dict.values()) if entry.fqns is not None else []
                self.plan = plan = entry.plan
        return plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Any]:
        if self.cache_plans and all(type(p) is KeyedSavePlan for p in all_plans):
            key = (self._settings, tuple(p.token for p in all_plans))
            with _lock:
                got = _globals.get(key)
            if got is not None and got.fits(all_plans):
                # A Metadata of its own (its large fields shared): the writer sets this save's
                # storage_data and storage_meta on it, and dcp.save returns it.
                self.global_plan, self.metadata = got.plans, dataclasses.replace(got.metadata)
                return got.plans, self.metadata
            with collector_paused():
                plans, metadata = super().create_global_plan(all_plans)
            plans = [_keyed(p) for p in plans]
            _remember(_globals, key, _Global(list(all_plans), plans, metadata))
            self.global_plan = plans
            return plans, metadata
        with collector_paused():
            return super().create_global_plan(all_plans)

    def _dedup_save_plans(self, all_plans: list[SavePlan]) -> list[SavePlan]:
        # DCP's (torch >= 2.6) keeps every item of a lone plan: nothing to deduplicate.
        if len(all_plans) == 1:
            return list(all_plans)
        dedup = getattr(super(), "_dedup_save_plans", None)
        if dedup is not None:
            return dedup(all_plans)
        from torch.distributed.checkpoint._dedup_save_plans import dedup_save_plans

        return dedup_save_plans(all_plans, self.dedup_save_to_lowest_rank)

    def _create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Any]:
        # DCP's (torch >= 2.6, which calls it; default_planner.py), its index rewrite made as in
        # global_plan.py; the same plans, Metadata and ValueError.
        plans, metadata = global_save_plan(self._dedup_save_plans(all_plans))
        if self.flatten_state_dict:
            metadata = dataclasses.replace(metadata, planner_data=merged_planner_data(plans))
        errors = _dcp_planner._validate_global_plan(plans, metadata)
        if errors is False:  # torch versions whose check answers a bool
            raise ValueError("Failed to validate global plan")
        if isinstance(errors, list) and errors:
            summary = "; ".join(errors)
            raise ValueError(
                f"Failed to validate global plan: {summary[:500] + '... (truncated)' if len(summary) > 500 else summary}"
            )
        return plans, metadata

    def resolve_all(self, plan: SavePlan) -> list[Any] | None:
        """Every item's data as :meth:`resolve_data` gives it, in ``plan``'s order, without a
        lookup per item; None where this planner cannot (a subclass that changes how data is
        resolved, a structure it does not remember). For hostreg's writer."""
        entry = self._entry
        cls = type(self)
        if (
            entry is None
            or entry.fqns is None
            or cls.resolve_data is not DefaultSavePlanner.resolve_data
            or cls.lookup_object is not DefaultSavePlanner.lookup_object
            or cls.transform_object is not DefaultSavePlanner.transform_object
        ):
            return None
        got = entry.positions
        if got is None or got[0] is not plan.items:
            got = entry.positions = (plan.items, *_positions(entry, plan.items, self._leaves))
        positions, slow = got[1], got[2]
        if positions is None:
            return None
        data = list(map(self._leaves.__getitem__, positions))
        for i in slow:  # DTensors, bytes: DCP's own way
            data[i] = self.resolve_data(plan.items[i])
        return data

    def structure_token(self) -> str | None:
        """A token naming this save's structure (the key of the module docstring): equal for
        two saves exactly when their tensors agree in every property the key lists. None when
        this save's structure is not one this planner remembers."""
        return None if self._entry is None else self._entry.plan.token
