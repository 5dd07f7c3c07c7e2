"""The solver: the whole time/memory frontier of composed plans, then budget lookups.

An exact dynamic programme over the chain of segment instances. After instance n the partial
plans are kept per class: the strategy of its last block (the only thing the next resharding
cost depends on), the combining groups already paid for, and the strategies given to the open
shared blocks. A block is shared when some instance's options are priced under its strategy
(`Option.context`); it is open after n when instances on both sides of that cut involve it
(one owns it, the other depends on it, or both depend on it), so the rest of the chain must
agree with the strategy the plan so far gave it. Memory is not additive: it is the largest
of the levels the step passes through, one per instance (`CostModel.memory`). A partial plan
carries what it holds into later levels (`held`) and the largest level so far (`total`), and
within a class the partial plans undominated by (time, held, total) survive; one pass yields
every Pareto-optimal plan, and every one is consistent (one real program). A dependency spans
a few instances (a tied parameter, a residual skip), so few shared blocks are open at any cut
and the classes stay few however deep the chain. Segments of one type may take different
configurations. A budget query is a binary search on the frontier.

Two bounds keep a space too wide from running away: a time limit and a memory limit, past
which the space is refused (`FrontierTooLargeError`) rather than solved for hours or swapped.
Such a space can still be solved approximately, with a memory resolution: at its heaviest
steps plans whose memory differs by less than the resolution stand for each other, and the
frontier states the bound this costs (`Frontier.memory_slack`). Time is never rounded.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from time import monotonic

import numpy as np

from explorer.cost import CostModel, Option
from explorer.errors import AnalysisError, FrontierTooLargeError, InputError, NoPlanFitsError
from explorer.pareto import _pareto, _skyline
from explorer.units import format_bytes, memory_limit


@dataclass(frozen=True, slots=True)
class FrontierPoint:
    time: float
    memory: int
    selection: tuple[int, ...]  # option index per instance


@dataclass(frozen=True, slots=True)
class Frontier:
    """Pareto-optimal plans, by increasing memory and decreasing time.

    `memory_slack` is 0 for the exact frontier. A frontier solved with a memory resolution
    (`solve_frontier`) may miss exact plans, but every plan of the exact frontier has one here
    no slower whose memory is less than `memory_slack` bytes more: a budget query is then no
    slower than the exact frontier's answer for the budget less `memory_slack`.
    """

    points: tuple[FrontierPoint, ...]
    memory_slack: int = 0

    def approximation(self, formatted: Callable[[int], str]) -> str:
        """What an approximate frontier promises, its slack given by `formatted` (a byte
        count as text); "" for the exact frontier."""
        if not self.memory_slack:
            return ""
        return (
            "approximate: every plan of the exact frontier has one here no slower within "
            f"{formatted(self.memory_slack)} more memory"
        )

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


# Candidate partial plans (a plan followed by an option) built and pruned at once, at most
# about this many: a wide space's can outgrow the machine (MoE-7.1B on 2x4 with whole-mesh
# strategies was killed holding 23 GB). The survivors of chunks pruned apart, pruned again
# together, are one pass's (dominance is transitive).
CANDIDATE_CHUNK = 8_000_000
# What the solver may hold ("24GiB", or bytes): by default half of this machine's memory. A
# space whose partial plans outgrow it is refused (`FrontierTooLargeError`) instead of taking
# the process down with it.
MEMORY_LIMIT_VARIABLE = "EXPLORER_SOLVER_MEMORY_LIMIT"
# How long the solver may take, in seconds ("none": no limit): a space whose exact frontier
# needs longer is refused. Memory is no bound on time: MoE-7.1B's whole-mesh space on 2x4 grows
# its partial plans slowly enough to run for hours before reaching half of this machine's.
TIME_LIMIT_VARIABLE = "EXPLORER_SOLVER_TIME_LIMIT"
DEFAULT_TIME_LIMIT = 600.0
UNIFORM_CHECK_EVERY = 1024  # the uniform solver reads the clock once per so many configurations
# With a memory resolution, the steps that build more candidate partial plans than this compare
# their memory in units of it (`solve_frontier`); the others, and every step without one, stay
# exact. MoE-7.1B's whole-mesh space on 2x4 builds 60 to 230 million at 16 of its 66 steps.
APPROXIMATE_ABOVE = 2_000_000

Pins = Mapping[int, Mapping[int, int]]  # instance -> {block position in instance: strategy}
# A plan's option indices, or a function that names them when asked (after filtering).
Selection = tuple[int, ...] | Callable[[], tuple[int, ...]]


def solve_frontier(
    model: CostModel, pins: Pins | None = None, uniform: bool = False, memory_resolution: int = 0
) -> Frontier:
    """Every Pareto-optimal plan of `model`.

    `pins[n][k] = s` forces block `k` of instance `n` onto strategy `s`. With `uniform`, all
    instances that share options (one segment type) take the same configuration, and every
    block the strategy of its twin (`CostModel.twins`: a scan's iterations run one body).

    A `memory_resolution` of r bytes trades exactness for time where a space is too wide to
    solve exactly: at a step building more than `APPROXIMATE_ABOVE` candidate partial plans, a
    plan no slower whose memory terms are in the same or lower units of r stands for another.
    Each such step may cost the plans after it less than r bytes, never time, so the frontier
    says how far from the exact one it may be (`Frontier.memory_slack`: r times those steps).
    """
    # the uniform solver takes no resolution: its refusals say "exactly" whatever was asked
    deadline = _Deadline(model, solver_time_limit(), 0 if uniform else memory_resolution)
    sharing = _sharing(model)
    allowed = _allowed(model, pins or {}, sharing, uniform)
    if not uniform:
        candidates, coarse_steps = _chain(model, allowed, sharing, deadline, memory_resolution)
        return _frontier(candidates, model, coarse_steps * memory_resolution)
    candidates = _uniform(model, allowed, sharing, deadline)
    if not candidates:
        raise AnalysisError(
            "no common configuration per segment type: the pins, the failed reshardings or the "
            "strategies of the blocks the types share leave none"
        )
    return _frontier(candidates, model)


@dataclass(frozen=True, slots=True)
class _Sharing:
    """The shared blocks (those some instance's options are priced under) and who involves them."""

    depends: tuple[tuple[int, ...], ...]  # per instance: CostModel.dependencies
    owner: dict[int, tuple[int, int]]  # shared block -> (its instance, its position there)
    owned: tuple[dict[int, int], ...]  # per instance: shared block it owns -> its position
    touched: tuple[tuple[int, ...], ...]  # per instance: shared blocks it owns or depends on
    # per instance n: the shared blocks instances on both sides of the cut after n involve
    open_after: tuple[tuple[int, ...], ...]


def _sharing(model: CostModel) -> _Sharing:
    depends = model.dependencies or tuple(() for _ in model.options)
    involved: dict[int, list[int]] = {}  # shared block -> the instances that involve it
    for n, blocks in enumerate(depends):
        for b in blocks:
            involved.setdefault(b, []).append(n)
    owner = {
        block: (n, position)
        for n, blocks in enumerate(model.instance_blocks)
        for position, block in enumerate(blocks)
        if block in involved
    }
    for block, instances in involved.items():
        if block not in owner:
            raise AnalysisError(f"block {block} belongs to no segment instance")
        instances.append(owner[block][0])
    shared = sorted(involved)
    owned = tuple(
        {b: p for b, (m, p) in owner.items() if m == n} for n in range(len(model.options))
    )
    return _Sharing(
        depends=depends,
        owner=owner,
        owned=owned,
        touched=tuple(tuple(sorted({*owned[n], *depends[n]})) for n in range(len(depends))),
        open_after=tuple(
            tuple(b for b in shared if min(involved[b]) <= n < max(involved[b]))
            for n in range(len(depends))
        ),
    )


def _shared_values(option: Option, n: int, sharing: _Sharing) -> tuple[int, ...] | None:
    """The strategy `option` of instance `n` gives each of its touched shared blocks, or None
    when it contradicts itself (a block it both owns and depends on, priced under another)."""
    if len(option.context) != len(sharing.depends[n]):
        return None
    values: dict[int, int] = {}
    given = [
        *zip(sharing.depends[n], option.context, strict=True),
        *((b, option.choices[p]) for b, p in sharing.owned[n].items()),
    ]
    for block, strategy in given:
        if values.setdefault(block, strategy) != strategy:
            return None
    return tuple(values[b] for b in sharing.touched[n])


def _allowed(model: CostModel, pins: Pins, sharing: _Sharing, uniform: bool) -> list[list[int]]:
    """Per instance, the options the pins leave, less those another beats wherever it goes.

    With `uniform`, every instance of one type gets the options all of them allow.
    """
    pinned = []
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
        pinned.append(keep)
    allowed: list[list[int]] = [[] for _ in model.options]
    if uniform:
        types: dict[int, list[int]] = {}
        for n, options in enumerate(model.options):
            types.setdefault(id(options), []).append(n)
        for members in types.values():
            common = sorted(set.intersection(*(set(pinned[n]) for n in members)))
            anywhere = {p for n in members for p in sharing.owned[n].values()}
            survivors = _undominated(model.options[members[0]], common, sorted(anywhere))
            for n in members:
                allowed[n] = survivors
        return allowed
    unpinned: dict[tuple[int, tuple[int, ...]], list[int]] = {}  # instances of one type share
    for n, options in enumerate(model.options):
        positions = tuple(sorted(sharing.owned[n].values()))
        if pins.get(n):
            allowed[n] = _undominated(options, pinned[n], positions)
        else:
            key = (id(options), positions)
            if key not in unpinned:
                unpinned[key] = _undominated(options, pinned[n], positions)
            allowed[n] = unpinned[key]
    return allowed


def _undominated(options: tuple[Option, ...], keep: list[int], shared: Sequence[int]) -> list[int]:
    """Drop options beaten on time and on every memory term a plan composes (`_steps`) by
    one with the same ends (and the same context, combining groups and strategies of the
    `shared` positions, which the rest of the plan depends on)."""
    out = []
    costs = {i: (options[i].time, *_steps(options[i]), options[i].constants) for i in keep}
    for i in keep:
        a = options[i]
        beaten = any(
            j != i
            and options[j].first == a.first
            and options[j].last == a.last
            and options[j].context == a.context
            and options[j].combined == a.combined
            and all(options[j].choices[p] == a.choices[p] for p in shared)
            and all(x <= y for x, y in zip(costs[j], costs[i], strict=True))
            and (*costs[j], j) < (*costs[i], i)
            for j in keep
        )
        if not beaten:
            out.append(i)
    return out


def _steps(option: Option, opens_type: bool = False) -> tuple[int, int, int]:
    """What taking `option` adds to a partial plan's memory (`_chain`): to what it holds into
    later levels, to the whole-step memory, and the level of the option's own instance above
    what was held before it. The first instance of a type also holds the type's constants."""
    # its gradients count in every later level: made before them (backward runs in reverse)
    held = option.persistent + option.saved + (option.constants if opens_type else 0)
    return held, option.persistent + option.gradients, held + option.transient


def _chain(
    model: CostModel,
    allowed: list[list[int]],
    sharing: _Sharing,
    deadline: _Deadline,
    memory_resolution: int = 0,
) -> tuple[list[tuple[float, int, Selection]], int]:
    """Pareto plans of the chain, in one pass carrying the largest memory level so far, and
    how many steps compared memory in units of `memory_resolution` (`solve_frontier`).

    A class is a row: the last block's strategy, the mask of combining groups already paid
    for (a group's latency is paid by the first option that has combinable collectives of it:
    they share one bucket), then the strategies of the shared blocks open after the instance.
    The partial plans are flat arrays, each with its class, pruned per class by `_skyline`.

    A partial plan's `held` is what every later level holds from it: the persistent memory
    and gradients of all its instances (every later level, as the whole step, counts all
    gradients and takes back those not made yet) plus their saved activations less their
    gradients. Its `total` is its whole-step memory were the plan to end here: the whole-step
    terms plus the largest level so far.
    """
    latency: dict[str, float] = {}
    for n, opts in enumerate(allowed):
        for i in opts:
            for key, _, seconds in model.options[n][i].combined:
                latency[key] = seconds
    groups = sorted(latency)
    bit = {key: 1 << k for k, key in enumerate(groups)}
    limit = solver_memory_limit()
    history_bytes = 0
    classes = np.zeros((1, 2), dtype=np.int64)  # before the first instance: nothing open
    time = np.zeros(1)
    held = np.zeros(1, dtype=np.int64)
    total = np.zeros(1, dtype=np.int64)  # the optimizer's level: the gradients, none yet
    of_class = np.zeros(1, dtype=np.int64)
    history: list[tuple[np.ndarray, np.ndarray]] = []  # per instance: previous plan, option
    coarse_steps = 0
    for n, opts in enumerate(allowed):
        deadline.check(n, len(time), len(classes))
        was_open = sharing.open_after[n - 1] if n else ()
        touched = sharing.touched[n]
        usable = [(i, _shared_values(model.options[n][i], n, sharing)) for i in opts]
        usable = [(i, v) for i, v in usable if v is not None]
        ids = np.array([i for i, _ in usable], dtype=np.int64)
        options = [model.options[n][i] for i in ids]
        gives = np.array([v for _, v in usable], dtype=np.int64).reshape(len(usable), len(touched))
        lasts = np.array([o.last for o in options], dtype=np.int64)
        masks = np.array([sum(bit[k] for k, _, _ in o.combined) for o in options], dtype=np.int64)
        # class x option: does the option agree with the strategies the class gave the shared
        # blocks it touches, and what does taking it cost
        agrees = np.ones((len(classes), len(options)), dtype=bool)
        for k, block in enumerate(touched):
            if block in was_open:
                carried = classes[:, 2 + was_open.index(block)]
                agrees &= carried[:, None] == gives[None, :, k]
        step = np.broadcast_to(np.array([o.time for o in options]), agrees.shape).copy()
        if n:
            step += _resharding(model.reshard[n - 1], classes[:, 0], options)
        newly_paid = masks[None, :] & ~classes[:, 1][:, None]
        for key in groups:
            step += latency[key] * ((newly_paid & bit[key]) != 0)
        fits = agrees & np.isfinite(step)
        if not fits.any():
            shared = [b for b in touched if b in was_open]
            raise AnalysisError(_dead_end(model, n, bool(agrees.any()), shared))
        # the class each fitting (class, option) pair leads to
        pair_class, pair_option = np.nonzero(fits)
        columns = [lasts[pair_option], classes[pair_class, 1] | masks[pair_option]]
        for block in sharing.open_after[n]:
            columns.append(
                classes[pair_class, 2 + was_open.index(block)]
                if block in was_open
                else gives[pair_option, touched.index(block)]
            )
        classes, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_inverse=True)
        leads_to = np.zeros(fits.shape, dtype=np.int64)
        leads_to[pair_class, pair_option] = inverse.reshape(-1)
        opens = model.opens_type(n)
        adds = np.array([_steps(o, opens) for o in options], dtype=np.int64)
        adds = adds.reshape(len(options), 3)
        # every partial plan followed by every option its class fits, pruned in chunks of
        # plans where they are many: the survivors so far go first, as their plans do, and
        # `_skyline`'s stable sorts keep equal plans in that order, so the last pruning
        # decides as one pass would
        built = fits.sum(axis=1)[of_class]
        unit = memory_resolution if built.sum() > APPROXIMATE_ABOVE else 0
        coarse_steps += unit > 0
        weights = built + len(options) / 8  # candidates, and the mask
        survivors: tuple[np.ndarray, ...] = ()
        for lo, hi in _chunks(weights, CANDIDATE_CHUNK):
            plan, option = np.nonzero(fits[of_class[lo:hi]])
            plan += lo
            came = of_class[plan]
            candidates: tuple[np.ndarray, ...] = (
                plan,
                option,
                leads_to[came, option],  # class
                time[plan] + step[came, option],
                held[plan] + adds[option, 0],
                np.maximum(total[plan] + adds[option, 1], held[plan] + adds[option, 2]),
            )
            if survivors:
                candidates = tuple(map(np.concatenate, zip(survivors, candidates, strict=True)))
            group, times, holds, reached = candidates[2:]
            if unit:  # a plan no slower, within the same units of memory, stands for another
                holds, reached = holds // unit, reached // unit
            keep = _skyline(group, times, holds, reached)
            survivors = tuple(column[keep] for column in candidates)
            _check_room(
                model, n, survivors, history_bytes, limit, memory_resolution=memory_resolution
            )
            deadline.check(n, len(survivors[0]), len(classes))
        plan, option, of_class, time, held, total = survivors
        history.append((plan, ids[option]))
        history_bytes += plan.nbytes + option.nbytes

    def walk(k: int) -> tuple[int, ...]:
        """Follow the back pointers from final plan `k`."""
        selection = [0] * len(allowed)
        for n in range(len(allowed) - 1, -1, -1):
            previous, option = history[n]
            selection[n] = int(option[k])
            k = int(previous[k])
        return tuple(selection)

    plans: list[tuple[float, int, Selection]] = [
        (float(time[k]), int(total[k]), functools.partial(walk, k)) for k in range(len(time))
    ]
    return plans, coarse_steps


def solver_memory_limit() -> int | None:
    """Bytes the solver may hold (`MEMORY_LIMIT_VARIABLE`; None: no limit known)."""
    return memory_limit(MEMORY_LIMIT_VARIABLE)


def solver_time_limit() -> float | None:
    """Seconds the solver may take (`TIME_LIMIT_VARIABLE`, else `DEFAULT_TIME_LIMIT`; None: no
    limit); an `InputError` naming the variable where it is not a number of seconds."""
    given = os.environ.get(TIME_LIMIT_VARIABLE, "").strip()
    if not given:
        return DEFAULT_TIME_LIMIT
    if given.lower() == "none":
        return None
    try:
        seconds = float(given)
    except ValueError:
        seconds = math.nan
    if not seconds >= 0:  # NaN too
        raise InputError(
            f"{TIME_LIMIT_VARIABLE}: expected a number of seconds >= 0 (such as '600' or "
            f"'1e4'), or 'none' for no limit; found {given!r}"
        )
    return None if math.isinf(seconds) else seconds


class _Deadline:
    """The solver's time limit: `check` refuses the space once it is past, saying where."""

    def __init__(self, model: CostModel, limit: float | None, memory_resolution: int) -> None:
        self.model = model
        self.limit = limit
        self.memory_resolution = memory_resolution
        self.start = monotonic()

    def check(self, n: int, plans: int, classes: int) -> None:
        """Refuse the space if the limit is past, at instance `n` with `plans` partial plans
        over `classes` classes alive (the uniform solver: partial configurations tried, 0)."""
        if self.limit is None or monotonic() - self.start <= self.limit:
            return
        where = f"{self.model.labels[n]!r} ({n + 1} of {len(self.model.options)})"
        over = f"{classes:,} class" + ("es" if classes > 1 else "")
        alive = (
            f"{plans:,} partial plans over {over}"
            if classes
            else f"{plans:,} partial common configurations tried"
        )
        raise FrontierTooLargeError(
            f"{_too_large(self.memory_resolution)}: it was not solved within {self.limit:g} s "
            f"(${TIME_LIMIT_VARIABLE}; 'none' for no limit). It had reached segment instance "
            f"{where} with {alive}. {_NARROW} or raise the limit."
        )


# What every refusal offers the user first: a space with fewer configurations.
_NARROW = "Narrow the space (pins, a smaller config_cap, without whole_mesh or shard_parameters)"


def _too_large(memory_resolution: int) -> str:
    """How a refusal opens: an approximate solve was refused too, and says at what resolution."""
    if not memory_resolution:
        return "the frontier of this space is too large to solve exactly"
    return (
        "the frontier of this space is too large to solve even with a memory resolution of "
        f"{format_bytes(memory_resolution)}"
    )


# The partial plans alive at once, as a multiple of their own arrays: the next chunk's
# candidates and `_skyline`'s sorts beside them.
_WORKING_COPIES = 4


def _check_room(
    model: CostModel,
    n: int,
    survivors: tuple[np.ndarray, ...],
    history_bytes: int,
    limit: int | None,
    *,
    memory_resolution: int,
) -> None:
    """Refuse to go on where the partial plans would outgrow `limit` bytes."""
    alive = sum(column.nbytes for column in survivors)
    needed = history_bytes + _WORKING_COPIES * alive
    if limit is None or needed <= limit:
        return
    raise FrontierTooLargeError(
        f"{_too_large(memory_resolution)}: at segment instance {model.labels[n]!r} "
        f"({n + 1} of {len(model.options)}), {len(survivors[0]):,} partial plans survive, and "
        f"with those before them the solver would hold about {_gib(needed)}, over its "
        f"{_gib(limit)} (${MEMORY_LIMIT_VARIABLE}, by default half of this machine's memory). "
        f"{_NARROW} or raise the limit on a larger machine."
    )


def _chunks(weights: np.ndarray, size: float) -> list[tuple[int, int]]:
    """Consecutive ranges of plans of about `size` total weight each (at least one plan)."""
    if len(weights) == 0:
        return [(0, 0)]
    ends = np.cumsum(weights)
    cuts = np.searchsorted(ends, np.arange(size, ends[-1], size)) + 1
    edges = np.unique(np.concatenate(([0], cuts, [len(weights)])))
    return [(int(lo), int(hi)) for lo, hi in itertools.pairwise(edges)]


def _resharding(
    table: Mapping[tuple[int, int], float], lasts: np.ndarray, options: Sequence[Option]
) -> np.ndarray:
    """Seconds to reshard from each last strategy to each option's first: infinite where the
    resharding failed to profile."""
    firsts = np.array([o.first for o in options], dtype=np.int64)
    dense = np.full((int(lasts.max()) + 1, int(firsts.max(initial=0)) + 1), np.inf)
    for (last, first), seconds in table.items():
        if last < dense.shape[0] and first < dense.shape[1]:
            dense[last, first] = seconds
    return np.asarray(dense[lasts][:, firsts])


def _dead_end(model: CostModel, n: int, agreed: bool, shared: list[int]) -> str:
    where = f"no configuration of {model.labels[n]!r} can follow the previous segment: "
    if agreed:
        return where + "every resharding between them failed to profile"
    return where + (
        "none agrees with the strategies the segments before it gave the blocks it shares "
        f"with them ({shared})"
    )


def _frontier(
    candidates: Sequence[tuple[float, int, Selection]], model: CostModel, memory_slack: int = 0
) -> Frontier:
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
    return Frontier(tuple(points), memory_slack)


def _uniform(
    model: CostModel, allowed: list[list[int]], sharing: _Sharing, deadline: _Deadline
) -> list[tuple[float, int, Selection]]:
    """One configuration per group of instances sharing their options (a segment type).

    The types' configurations are enumerated type by type, a configuration dropped as soon as
    it disagrees with an earlier type's (or its own) on a shared block: with one configuration
    per type, a dependency is a tie between two types' positions, the same at every depth.
    """
    types: dict[int, list[int]] = {}
    for n, options in enumerate(model.options):
        types.setdefault(id(options), []).append(n)
    members = list(types.values())
    type_of = {n: t for t, group in enumerate(members) for n in group}
    # (dependent type, owner type) -> {(context index, owner's block position)}
    ties: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for n, depends in enumerate(sharing.depends):
        for k, block in enumerate(depends):
            m, position = sharing.owner[block]
            ties.setdefault((type_of[n], type_of[m]), set()).add((k, position))

    def agree(dependent: Option, owner: Option, pairs: set[tuple[int, int]]) -> bool:
        return all(dependent.context[k] == owner.choices[p] for k, p in pairs)

    choices = []
    for t, group in enumerate(members):
        options = model.options[group[0]]
        own = ties.get((t, t), set())
        choices.append(
            [
                i
                for i in allowed[group[0]]
                if all(len(options[i].context) == len(sharing.depends[n]) for n in group)
                and agree(options[i], options[i], own)
            ]
        )

    def twins_agree(t: int, i: int, taken: dict[int, int]) -> dict[int, int] | None:
        """`taken` (twin -> strategy) extended by type t's configuration i, or None if one
        of its blocks' twins already took another strategy (a scan's iterations run one
        body, and its first and last iterations may be instances of other types)."""
        fixed = dict(taken)
        for n in members[t]:
            strategies = model.options[n][i].choices
            for block, strategy in zip(model.instance_blocks[n], strategies, strict=True):
                if fixed.setdefault(model.twin(block), strategy) != strategy:
                    return None
        return fixed

    tried = itertools.count(1)  # partial configurations, each one a few checks of agreement

    def consistent(prefix: list[int], taken: dict[int, int]) -> Iterator[list[int]]:
        t = len(prefix)
        visits = next(tried)
        if visits % UNIFORM_CHECK_EVERY == 0:
            deadline.check(members[min(t, len(members) - 1)][0], visits, 0)
        if t == len(members):
            yield prefix
            return
        options = model.options[members[t][0]]
        chosen = [model.options[members[u][0]][prefix[u]] for u in range(t)]
        for i in choices[t]:
            if not all(
                agree(options[i], chosen[u], ties.get((t, u), set()))
                and agree(chosen[u], options[i], ties.get((u, t), set()))
                for u in range(t)
            ):
                continue
            fixed = twins_agree(t, i, taken) if model.twins else taken
            if fixed is not None:
                yield from consistent([*prefix, i], fixed)

    candidates: list[tuple[float, int, Selection]] = []
    for combo in consistent([], {}):
        selection = [0] * len(model.options)
        for group, choice in zip(members, combo, strict=True):
            for n in group:
                selection[n] = choice
        time = model.time(selection)
        if np.isfinite(time):
            candidates.append((time, model.memory(selection), tuple(selection)))
    return candidates


def _gib(value: float) -> str:
    return f"{value / 2**30:.3f} GiB"
