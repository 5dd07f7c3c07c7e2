"""The solver: the whole time/memory frontier of composed plans, then budget lookups.

An exact dynamic programme over the chain of segment instances. After instance n the state is,
for each strategy of its last block (the only thing the next resharding cost depends on), the
undominated partial plans by (time, persistent memory, largest transient so far). Memory is
`sum(persistent) + max(transient)`, not additive, so the largest transient is carried along as
a third objective rather than summed; one pass yields every Pareto-optimal plan. Segments of
one type may take different configurations. A budget query is a binary search on the frontier.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from explorer.cost import CostModel, Option
from explorer.errors import AnalysisError


class NoPlanFitsError(AnalysisError):
    """The memory budget is below the smallest plan."""


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    time: float
    memory: int
    selection: tuple[int, ...]  # option index per instance


@dataclass(frozen=True, slots=True)
class Frontier:
    """Pareto-optimal plans, by increasing memory and decreasing time."""

    points: tuple[FrontierPoint, ...]

    def __post_init__(self) -> None:
        for a, b in itertools.pairwise(self.points):
            if not (a.memory < b.memory and a.time > b.time):
                raise ValueError("frontier points must trade memory for time strictly")

    @property
    def min_memory(self) -> int:
        return self.points[0].memory

    def query(self, budget: float) -> FrontierPoint:
        """The fastest plan whose predicted memory fits `budget` bytes per device."""
        if not self.points or budget < self.points[0].memory:
            least = self.points[0].memory if self.points else 0
            raise NoPlanFitsError(
                f"no plan fits a memory budget of {_gib(budget)} per device: the smallest plan "
                f"needs {_gib(least)} ({least} bytes). Raise the budget, use more devices, or "
                "add a mesh axis."
            )
        index = bisect.bisect_right([p.memory for p in self.points], budget) - 1
        return self.points[index]


Pins = Mapping[int, Mapping[int, int]]  # instance -> {block position in instance: strategy}
# A plan's option indices, or a function that names them when asked (after filtering).
Selection = tuple[int, ...] | Callable[[], tuple[int, ...]]


def solve_frontier(model: CostModel, pins: Pins | None = None, uniform: bool = False) -> Frontier:
    """Every Pareto-optimal plan of `model`.

    `pins[n][k] = s` forces block `k` of instance `n` onto strategy `s`. With `uniform`, all
    instances that share options (one segment type) take the same configuration, and every
    block the strategy of its twin (`CostModel.twins`: a scan's iterations run one body).
    """
    allowed = _allowed(model, pins or {})
    candidates: list[tuple[float, int, Selection]] = []
    dead_end: AnalysisError | None = None
    for narrowed in _consistent_choices(model, allowed):
        if uniform:
            candidates += _uniform(model, narrowed)
            continue
        # one joint strategy of the shared blocks may have no profiled way through (a quick
        # look skips some reshardings); the others still make plans
        try:
            candidates += _chain(model, narrowed)
        except AnalysisError as err:
            dead_end = err
    if dead_end is not None and not candidates:
        raise dead_end
    if uniform and not candidates:
        raise AnalysisError(
            "the pins leave some segment type, or the iterations of a scan, no common configuration"
        )
    return _frontier(candidates, model)


def _consistent_choices(model: CostModel, allowed: list[list[int]]) -> Iterator[list[list[int]]]:
    """`allowed` narrowed to each joint strategy of the blocks some instance depends on.

    An option priced under one strategy of a block in another instance (its `context`) only
    goes with the options of that instance that give the block that strategy; enumerating
    the (few) joint strategies of those blocks keeps every plan one real program.
    """
    targets = sorted({b for depends in model.dependencies for b in depends})
    if not targets:
        yield allowed
        return
    where = {}
    for n, blocks in enumerate(model.instance_blocks):
        for position, block in enumerate(blocks):
            where[block] = (n, position)
    choices = [
        sorted({model.options[where[b][0]][i].choices[where[b][1]] for i in allowed[where[b][0]]})
        for b in targets
    ]
    for combo in itertools.product(*choices):
        fixed = dict(zip(targets, combo, strict=True))
        narrowed = []
        for n, indices in enumerate(allowed):
            wanted_context = tuple(fixed[b] for b in model.dependencies[n])
            own = [(p, fixed[b]) for b, (m, p) in where.items() if m == n and b in fixed]
            keep = [
                i
                for i in indices
                if model.options[n][i].context == wanted_context
                and all(model.options[n][i].choices[p] == c for p, c in own)
            ]
            if not keep:
                break
            narrowed.append(keep)
        else:
            yield narrowed


def _allowed(model: CostModel, pins: Pins) -> list[list[int]]:
    allowed = []
    shared: dict[int, list[int]] = {}  # instances of one type share their options tuple
    for n, options in enumerate(model.options):
        wanted = pins.get(n, {})
        keep = [
            i
            for i, option in enumerate(options)
            if all(k < len(option.choices) and option.choices[k] == s for k, s in wanted.items())
        ]
        if not keep:
            raise AnalysisError(
                f"the pins {dict(wanted)} leave segment {model.labels[n]!r} no profiled "
                "configuration; pin a strategy its blocks have"
            )
        if wanted:
            allowed.append(_undominated(options, keep))
        else:
            if id(options) not in shared:
                shared[id(options)] = _undominated(options, keep)
            allowed.append(shared[id(options)])
    return allowed


def _undominated(options: tuple[Option, ...], keep: list[int]) -> list[int]:
    """Drop options beaten on time, persistent and transient memory by one with the same ends
    (and the same context and combining groups, which the rest of the plan depends on)."""
    out = []
    for i in keep:
        a = options[i]
        beaten = any(
            j != i
            and options[j].first == a.first
            and options[j].last == a.last
            and options[j].context == a.context
            and options[j].combined == a.combined
            and options[j].time <= a.time
            and options[j].persistent <= a.persistent
            and options[j].transient <= a.transient
            and (options[j].time, options[j].persistent, options[j].transient, j)
            < (a.time, a.persistent, a.transient, i)
            for j in keep
        )
        if not beaten:
            out.append(i)
    return out


@dataclass(frozen=True, slots=True)
class _States:
    """Partial plans ending in one strategy, sorted by time, with their back pointers."""

    time: np.ndarray
    persistent: np.ndarray
    level: np.ndarray  # index of the largest transient so far in the sorted transient values
    came_from: np.ndarray  # previous strategy class
    position: np.ndarray  # index in that class's states after the previous instance
    option: np.ndarray  # option index chosen for this instance


def _chain(model: CostModel, allowed: list[list[int]]) -> list[tuple[float, int, Selection]]:
    """Pareto plans of the chain, in one pass carrying the largest transient so far.

    States are kept per class: the strategy of the last block (the only thing the next
    resharding cost depends on) and the set of combining groups already paid for (a group's
    latency is paid by the first option that has combinable collectives of it: they share
    one bucket). They are pruned by `_skyline`. A plan's memory is its persistent sum plus
    the transient value of its level.
    """
    levels = np.array(
        sorted({model.options[n][i].transient for n, opts in enumerate(allowed) for i in opts}),
        dtype=np.int64,
    )
    latency: dict[str, float] = {}
    for n, opts in enumerate(allowed):
        for i in opts:
            for key, _, seconds in model.options[n][i].combined:
                latency[key] = seconds
    groups = sorted(latency)
    width = len(groups)  # a class is `last << width | mask of groups paid`
    bit = {key: 1 << k for k, key in enumerate(groups)}
    empty = np.zeros(1, np.int64)
    states = {-1: _States(np.zeros(1), empty, empty, empty, empty, empty)}
    history: list[dict[int, _States]] = []
    for n, opts in enumerate(allowed):
        options = [model.options[n][i] for i in opts]
        ids = np.array(opts)
        cost = np.array([o.time for o in options])
        held = np.array([o.persistent for o in options], dtype=np.int64)
        level = np.searchsorted(levels, [o.transient for o in options])
        firsts = np.array([o.first for o in options])
        lasts = np.array([o.last for o in options], dtype=np.int64)
        masks = np.array([sum(bit[k] for k, _, _ in o.combined) for o in options], dtype=np.int64)
        parts: dict[int, list[tuple[np.ndarray, ...]]] = {}
        for cls, before in states.items():
            prev_last, prev_mask = (
                (-1, 0) if cls == -1 else (cls >> width, cls & ((1 << width) - 1))
            )
            move = (
                np.zeros(len(options))
                if n == 0
                else np.array(
                    [model.reshard[n - 1].get((prev_last, int(f)), np.inf) for f in firsts]
                )
            )
            fresh = masks & ~prev_mask
            extra = np.array(
                [sum(latency[g] for g in groups if int(m) & bit[g]) for m in fresh], dtype=float
            )
            classes = (lasts << width) | masks | prev_mask
            for new_class in np.unique(classes):
                mine = classes == new_class
                # one row per option: each row is a time-sorted run, which the stable sort
                # below merges rather than sorts
                grid_t = (cost[mine] + move[mine] + extra[mine])[:, None] + before.time[None, :]
                shape = grid_t.shape
                finite = np.isfinite(grid_t).ravel()
                parts.setdefault(int(new_class), []).append(
                    (
                        grid_t.ravel()[finite],
                        (held[mine][:, None] + before.persistent[None, :]).ravel()[finite],
                        np.maximum(level[mine][:, None], before.level[None, :]).ravel()[finite],
                        np.full(shape, cls).ravel()[finite],
                        np.broadcast_to(np.arange(shape[1])[None, :], shape).ravel()[finite],
                        np.broadcast_to(ids[mine][:, None], shape).ravel()[finite],
                    )
                )
        new_states: dict[int, _States] = {}
        for new_class, pieces in parts.items():
            columns = [np.concatenate(c) for c in zip(*pieces, strict=True)]
            if not len(columns[0]):
                continue
            keep = _skyline(columns[0], columns[1], columns[2], levels)
            new_states[new_class] = _States(*(c[keep] for c in columns))
        states = new_states
        if not states:
            raise AnalysisError(
                f"no configuration of {model.labels[n]!r} can follow the previous segment: every "
                "resharding between them failed to profile"
            )
        history.append(states)

    def walk(cls: int, k: int) -> tuple[int, ...]:
        """Follow the back pointers from final point `k` of class `cls`."""
        selection = [0] * len(allowed)
        c, pos = cls, k
        for n in range(len(allowed) - 1, -1, -1):
            found = history[n][c]
            selection[n] = int(found.option[pos])
            c, pos = int(found.came_from[pos]), int(found.position[pos])
        return tuple(selection)

    return [
        (float(s.time[k]), int(s.persistent[k] + levels[s.level[k]]), functools.partial(walk, c, k))
        for c, s in states.items()
        for k in range(len(s.time))
    ]


def _skyline(
    times: np.ndarray, persistent: np.ndarray, level: np.ndarray, caps: np.ndarray
) -> np.ndarray:
    """Indices, in time order, of the partial plans no earlier one (in time order) dominates.

    Plan B dominates plan A, whatever follows, when it is no slower, holds no more persistent
    memory, and holds no more persistent plus largest transient memory: past both transients
    the plans pay the same future transient, below them their own. (A dominated plan with an
    equal time may survive: harmless, the final frontier is filtered strictly.)
    """
    order = np.argsort(times, kind="stable")
    total = persistent[order] + caps[level[order]]
    never = np.iinfo(np.int64).max
    # A cheap first sweep: an earlier plan whose whole memory is below this one's persistent
    # memory dominates it. Dominance is transitive, so the exact sweep below need only look
    # at the survivors.
    lowest = np.concatenate(([never], np.minimum.accumulate(total)[:-1]))
    order = order[lowest > persistent[order]]
    held = persistent[order]
    tier = level[order]
    total = held + caps[tier]
    dominated = np.zeros(len(order), dtype=bool)
    for value in np.flatnonzero(np.bincount(tier)):
        # least persistent memory among the earlier plans at this level
        running = np.minimum.accumulate(np.where(tier == value, held, never))
        earlier = np.concatenate(([never], running[:-1]))
        dominated |= earlier <= np.minimum(held, total - caps[value])
    return np.asarray(order[~dominated])


def _pareto(times: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both time and memory."""
    order = np.lexsort((memory, times))
    best = np.minimum.accumulate(memory[order])
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = memory[order][1:] < best[:-1]
    return np.asarray(order[keep])


def _frontier(candidates: Sequence[tuple[float, int, Selection]], model: CostModel) -> Frontier:
    """Pareto-filter the candidates, then name the plans of the survivors only.

    The chain pays one latency per combining group; a plan with more combinable collectives
    of a group than one bucket holds pays more (`CostModel.time`): survivors are re-timed
    with it and filtered again.
    """
    if not candidates:
        raise AnalysisError("no plan: every configuration combination is infeasible")
    times = np.array([c[0] for c in candidates])
    memory = np.array([c[1] for c in candidates], dtype=np.int64)
    keep = _pareto(times, memory)
    named = [candidates[k][2] for k in keep]
    selections = [sel() if callable(sel) else sel for sel in named]
    times = np.array([model.time(sel) for sel in selections])
    memory = memory[keep]
    final = _pareto(times, memory)
    points = sorted(
        (FrontierPoint(float(times[k]), int(memory[k]), selections[k]) for k in final),
        key=lambda p: p.memory,
    )
    return Frontier(tuple(points))


def _uniform(model: CostModel, allowed: list[list[int]]) -> list[tuple[float, int, Selection]]:
    """One configuration per group of instances sharing their options (a segment type), and
    one strategy per block and its twins (`CostModel.twins`: the same block in every
    iteration of a scan, whose applied step runs one body, may lie in instances of different
    types). Groups are chosen depth first, so the twins one group fixes narrow the next."""
    groups: dict[int, list[int]] = {}
    for n, options in enumerate(model.options):
        groups.setdefault(id(options), []).append(n)
    members = list(groups.values())
    choices_per_group = [
        sorted(set.intersection(*(set(allowed[n]) for n in group))) for group in members
    ]
    if any(not c for c in choices_per_group):
        return []
    candidates: list[tuple[float, int, Selection]] = []
    selection = [0] * len(model.options)

    def extend(g: int, taken: dict[int, int]) -> None:
        if g == len(members):
            time = model.time(selection)
            if np.isfinite(time):
                candidates.append((time, model.memory(selection), tuple(selection)))
            return
        for choice in choices_per_group[g]:
            fixed = dict(taken)
            if model.twins and not all(
                fixed.setdefault(model.twin(block), strategy) == strategy
                for n in members[g]
                for block, strategy in zip(
                    model.instance_blocks[n], model.options[n][choice].choices, strict=True
                )
            ):
                continue  # a twin of one of these blocks already took another strategy
            for n in members[g]:
                selection[n] = choice
            extend(g + 1, fixed)

    extend(0, {})
    return candidates


def _gib(value: float) -> str:
    return f"{value / 2**30:.3f} GiB"
