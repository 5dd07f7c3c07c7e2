"""The solver: the whole time/memory frontier of composed plans, then budget lookups.

An exact dynamic programme over the chain of segment instances. After instance n the state is,
for each strategy of its last block (the only thing the next resharding cost depends on), the
Pareto set of (time, persistent memory) of every partial plan. Memory is
`sum(persistent) + max(transient)`, not additive, so the programme runs once per cap on the
largest transient (each distinct transient value of a non-dominated option), with options above
the cap removed; each run's frontier is shifted by its cap and the union is Pareto-filtered.
Segments of one type may take different configurations. A budget query is a binary search on
the frontier.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
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
    instances that share options (one segment type) take the same configuration.
    """
    allowed = _allowed(model, pins or {})
    if uniform:
        return _uniform(model, allowed)
    candidates: list[tuple[float, int, Selection]] = []
    previous: list[list[int]] | None = None
    for cap in _caps(model, allowed):
        capped = _capped(model, allowed, cap)
        if any(not opts for opts in capped):
            continue
        # Raising the cap only helped if it let in an option on some (time, persistent)
        # front; otherwise every plan of this cap is one of the last cap's, with more memory.
        if capped == previous:
            continue
        previous = capped
        for time, persistent, selection in _chain(model, capped):
            candidates.append((time, persistent + cap, selection))
    return _frontier(candidates)


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
    """Drop options beaten on time, persistent and transient memory by one with the same ends."""
    out = []
    for i in keep:
        a = options[i]
        beaten = any(
            j != i
            and options[j].first == a.first
            and options[j].last == a.last
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


def _capped(model: CostModel, allowed: list[list[int]], cap: int) -> list[list[int]]:
    """Each instance's options with transient <= cap, on their (time, persistent) front."""
    memo: dict[tuple[int, int], list[int]] = {}  # instances of one type share the work
    out = []
    for n, opts in enumerate(allowed):
        key = (id(model.options[n]), id(opts))
        if key not in memo:
            options = model.options[n]
            memo[key] = _fastest_leanest(options, [i for i in opts if options[i].transient <= cap])
        out.append(memo[key])
    return out


def _fastest_leanest(options: tuple[Option, ...], keep: list[int]) -> list[int]:
    """Under a transient cap only time and persistent memory matter: per pair of end
    strategies, keep the options on that 2-D Pareto front."""
    out: list[int] = []
    ends = {(options[i].first, options[i].last) for i in keep}
    for end in ends:
        same = [i for i in keep if (options[i].first, options[i].last) == end]
        times = np.array([options[i].time for i in same])
        held = np.array([options[i].persistent for i in same], dtype=np.int64)
        out.extend(same[k] for k in _pareto(times, held))
    return sorted(out)


def _caps(model: CostModel, allowed: list[list[int]]) -> list[int]:
    """Transient caps worth trying: at least the largest of each instance's smallest."""
    floor = max(min(model.options[n][i].transient for i in opts) for n, opts in enumerate(allowed))
    values = {model.options[n][i].transient for n, opts in enumerate(allowed) for i in opts}
    return sorted(v for v in values if v >= floor)


def _chain(model: CostModel, allowed: list[list[int]]) -> list[tuple[float, int, Selection]]:
    """Pareto (time, persistent) plans of the chain with these options.

    States are kept per strategy of the last block; `trace[n][c]` holds, aligned with the
    surviving points of class `c` after instance `n`, the (previous class, previous position,
    option) each came from.
    """
    states: dict[int, tuple[np.ndarray, np.ndarray]] = {-1: (np.zeros(1), np.zeros(1, np.int64))}
    trace: list[dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]] = []
    for n, opts in enumerate(allowed):
        options = [model.options[n][i] for i in opts]
        ids = np.array(opts)
        cost = np.array([o.time for o in options])
        held = np.array([o.persistent for o in options], dtype=np.int64)
        firsts = np.array([o.first for o in options])
        lasts = np.array([o.last for o in options])
        step: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        new_states: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for last in np.unique(lasts):
            mine = lasts == last
            parts = []
            for cls, (times, persist) in states.items():
                move = (
                    np.zeros(mine.sum())
                    if n == 0
                    else np.array(
                        [model.reshard[n - 1].get((cls, int(f)), np.inf) for f in firsts[mine]]
                    )
                )
                # every earlier partial plan of this class times every option ending in `last`
                grid_t = times[:, None] + (cost[mine] + move)[None, :]
                grid_p = persist[:, None] + held[mine][None, :]
                shape = grid_t.shape
                finite = np.isfinite(grid_t).ravel()
                parts.append(
                    (
                        grid_t.ravel()[finite],
                        grid_p.ravel()[finite],
                        np.full(shape, cls).ravel()[finite],
                        np.broadcast_to(np.arange(shape[0])[:, None], shape).ravel()[finite],
                        np.broadcast_to(ids[mine][None, :], shape).ravel()[finite],
                    )
                )
            times, persist, prev_cls, prev_pos, option_ids = (
                np.concatenate(c) for c in zip(*parts, strict=True)
            )
            if not len(times):
                continue
            keep = _pareto(times, persist, strict=False)
            new_states[int(last)] = (times[keep], persist[keep])
            step[int(last)] = (prev_cls[keep], prev_pos[keep], option_ids[keep])
        states = new_states
        if not states:
            raise AnalysisError(
                f"no configuration of {model.labels[n]!r} can follow the previous segment: every "
                "resharding between them failed to profile"
            )
        trace.append(step)

    def walk(cls: int, k: int) -> tuple[int, ...]:
        """Follow the back pointers from final point `k` of class `cls`."""
        selection = [0] * len(allowed)
        c, pos = cls, k
        for n in range(len(allowed) - 1, -1, -1):
            prev_cls, prev_pos, option_ids = trace[n][c]
            selection[n] = int(option_ids[pos])
            c, pos = int(prev_cls[pos]), int(prev_pos[pos])
        return tuple(selection)

    return [
        (float(times[k]), int(persist[k]), functools.partial(walk, cls, k))
        for cls, (times, persist) in states.items()
        for k in range(len(times))
    ]


def _pareto(times: np.ndarray, memory: np.ndarray, strict: bool = True) -> np.ndarray:
    """Indices of the points no other point beats on both time and memory.

    `strict=False` sorts by time alone (about twice as fast): of several points with the
    same time, a dominated one may survive. Harmless inside the programme; the final frontier
    is always filtered strictly.
    """
    order = np.lexsort((memory, times)) if strict else np.argsort(times, kind="stable")
    best = np.minimum.accumulate(memory[order])
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = memory[order][1:] < best[:-1]
    return np.asarray(order[keep])


def _frontier(candidates: Sequence[tuple[float, int, Selection]]) -> Frontier:
    """Pareto-filter the candidates, then name the plans of the survivors only."""
    if not candidates:
        raise AnalysisError("no plan: every configuration combination is infeasible")
    times = np.array([c[0] for c in candidates])
    memory = np.array([c[1] for c in candidates], dtype=np.int64)
    keep = _pareto(times, memory)
    points = sorted((candidates[k] for k in keep), key=lambda c: c[1])
    return Frontier(
        tuple(FrontierPoint(t, m, sel() if callable(sel) else sel) for t, m, sel in points)
    )


def _uniform(model: CostModel, allowed: list[list[int]]) -> Frontier:
    """One configuration per group of instances sharing their options (a segment type)."""
    groups: dict[int, list[int]] = {}
    for n, options in enumerate(model.options):
        groups.setdefault(id(options), []).append(n)
    members = list(groups.values())
    choices_per_group = [
        sorted(set.intersection(*(set(allowed[n]) for n in group))) for group in members
    ]
    if any(not c for c in choices_per_group):
        raise AnalysisError("the pins leave some segment type no common configuration")
    candidates = []
    for combo in itertools.product(*choices_per_group):
        selection = [0] * len(model.options)
        for group, choice in zip(members, combo, strict=True):
            for n in group:
                selection[n] = choice
        time = model.time(selection)
        if np.isfinite(time):
            candidates.append((time, model.memory(selection), tuple(selection)))
    return _frontier(candidates)


def _gib(value: float) -> str:
    return f"{value / 2**30:.3f} GiB"
