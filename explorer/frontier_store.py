"""Frontiers kept across runs, by a digest of the cost model they were solved from.

Solving the frontier of a paper-scale step in a wide space takes minutes on a CPU core (GPT-2.6B
on 2x8 of two nodes, every block also offered its whole-mesh strategies: 98 instances, 193 s),
and analysing the step again reads the same profiles, so composes the same cost model and asks
the same question. A store keeps each frontier under a digest of everything that decides it:
every option of every instance and which instances share a type, the resharding tables, the
dependencies and twins, the pins, `uniform`, and the solver's own code (`solve`, `pareto` and
the cost model's arithmetic in `cost`). A kept frontier is read back checked: every point is
priced again by the cost model (`CostModel.time`, `CostModel.memory`), and one the model prices
otherwise is a miss, solved again, never trusted.

A frontier too large to solve (`FrontierTooLargeError`) is kept as such, with the solver's
memory and time limits then: asked again with no more room and no more time, it is refused at
once, not after minutes.

`analyze` keeps its frontier beside its profile cache (`frontier_store_path`), and
`Analysis.frontier_for` those under pins (the explorer's pins) in the same store; a cache kept
in memory keeps none. A store that cannot be opened, read or written costs the run nothing but
the time: the frontier is solved, with one warning saying why it was not kept.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sqlite3
import time
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from explorer.cost import CostModel
from explorer.errors import FrontierTooLargeError
from explorer.kept_rows import KeptRows
from explorer.solve import (
    Frontier,
    FrontierPoint,
    Pins,
    solve_frontier,
    solver_memory_limit,
    solver_time_limit,
)
from explorer.units import MEMORY_LIMIT_MARGIN, limit_raised


def _code_digest() -> str:
    """The code that decides a frontier: a change to any of it makes every kept one stale."""
    digest = hashlib.sha256()
    here = Path(__file__).parent
    for name in ("solve.py", "pareto.py", "cost.py"):
        digest.update(name.encode())
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


_CODE = _code_digest()


@dataclass(frozen=True, slots=True)
class SolvedFrontier:
    """A frontier and what solving it cost: `seconds` are those of the run that solved it,
    this one or, `kept`, an earlier one whose answer the store gave back."""

    frontier: Frontier
    seconds: float
    kept: bool


def frontier_store_path(profile_cache: Path | None) -> Path | None:
    """Where `analyze` keeps frontiers: beside the profile cache (`profiles.sqlite` ->
    `profiles.frontiers.sqlite`); None for a cache in memory."""
    return None if profile_cache is None else profile_cache.with_suffix(".frontiers.sqlite")


def question_digest(
    model: CostModel, pins: Pins | None, uniform: bool, memory_resolution: int = 0
) -> str:
    """A digest of everything that decides `solve_frontier(model, pins, uniform,
    memory_resolution)`."""
    hasher = hashlib.sha256()
    given = tuple(sorted((n, tuple(sorted(m.items()))) for n, m in (pins or {}).items()))
    hasher.update(repr((_CODE, uniform, given, memory_resolution)).encode())
    # instances of one type share one tuple of options (the uniform solver groups by it):
    # the digest names each type once and then refers to it by its index
    types: dict[int, int] = {}
    for n, options in enumerate(model.options):
        if id(options) not in types:
            types[id(options)] = len(types)
            hasher.update(repr(options).encode())
        hasher.update(repr((n, types[id(options)])).encode())
    tables = tuple(tuple(sorted(table.items())) for table in model.reshard)
    rest = (model.labels, tables, model.dependencies, model.instance_blocks, model.twins)
    hasher.update(repr((*rest, model.opens)).encode())
    return hasher.hexdigest()


class FrontierStore(KeptRows):
    """An SQLite table of frontiers: question digest -> the points and the solve's seconds."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, "frontiers", ("question",))

    def get_frontier(
        self, question: str, model: CostModel
    ) -> SolvedFrontier | FrontierTooLargeError | None:
        """The kept frontier, or the refusal kept for it (`put_refusal`) where the solver may
        hold no more now than then; None where neither is kept."""
        return self.get((question,), lambda fields: _frontier_from(fields, model))

    def put_refusal(self, question: str, refusal: FrontierTooLargeError, seconds: float) -> None:
        """Keep that the frontier outgrew the solver's limits, and how soon it did."""
        fields = {
            "too_large": str(refusal),
            "memory_limit": solver_memory_limit(),
            "time_limit": solver_time_limit(),
            "seconds": seconds,
        }
        self.put((question,), fields)

    def put_frontier(self, question: str, solved: SolvedFrontier) -> None:
        points = solved.frontier.points
        selections = json.dumps([p.selection for p in points], separators=(",", ":"))
        self.put(
            (question,),
            {
                "times": [p.time for p in points],
                "memory": [p.memory for p in points],
                # a frontier's plans differ in a few instances each: they pack well
                "selections": base64.b64encode(zlib.compress(selections.encode(), 9)).decode(),
                "memory_slack": solved.frontier.memory_slack,
                "seconds": solved.seconds,
            },
        )


def _frontier_from(
    fields: dict[str, Any], model: CostModel
) -> SolvedFrontier | FrontierTooLargeError | None:
    """The kept frontier, each point priced again by `model`: a ValueError (a miss, solved
    again) where a selection does not fit the model or is priced otherwise than kept. A kept
    refusal stands while the solver may hold no more and take no longer than it could then."""
    if "too_large" in fields:
        more_room = limit_raised(
            solver_memory_limit(), fields["memory_limit"], margin=MEMORY_LIMIT_MARGIN
        )
        if more_room or limit_raised(solver_time_limit(), fields["time_limit"]):
            return None  # more room or more time now: try again
        return FrontierTooLargeError(f"{fields['too_large']} (kept from an earlier run)")
    try:
        selections = json.loads(zlib.decompress(base64.b64decode(fields["selections"])))
    except zlib.error as err:
        raise ValueError(f"a kept frontier's plans do not unpack: {err}") from err
    times, memory = fields["times"], fields["memory"]
    if not len(selections) == len(times) == len(memory):
        raise ValueError("a kept frontier's columns differ in length")
    points = []
    for kept_time, kept_memory, selection in zip(times, memory, selections, strict=True):
        chosen = tuple(int(i) for i in selection)
        if len(chosen) != len(model.options) or not all(
            0 <= i < len(options) for i, options in zip(chosen, model.options, strict=True)
        ):
            raise ValueError("a kept plan names options the cost model does not have")
        if model.time(chosen) != kept_time or model.memory(chosen) != kept_memory:
            raise ValueError("a kept plan is priced otherwise by the cost model")
        points.append(FrontierPoint(float(kept_time), int(kept_memory), chosen))
    frontier = Frontier(tuple(points), int(fields["memory_slack"]))
    return SolvedFrontier(frontier, float(fields["seconds"]), kept=True)


def solve_kept(
    model: CostModel,
    pins: Pins | None = None,
    uniform: bool = False,
    *,
    store_path: Path | None = None,
    memory_resolution: int = 0,
) -> SolvedFrontier:
    """`solve_frontier(model, pins, uniform, memory_resolution)`, read from the store at
    `store_path` where it holds the answer, else solved and kept there (`store_path=None`:
    solved, kept nowhere)."""
    question = (
        question_digest(model, pins, uniform, memory_resolution) if store_path is not None else ""
    )
    store = _opened(store_path)
    try:
        if store is not None:
            try:
                found = store.get_frontier(question, model)
            except sqlite3.Error as err:
                _not_kept(store_path, "read", err)
                found = None
            if isinstance(found, FrontierTooLargeError):
                raise _hinted(found, memory_resolution, uniform) from None
            if found is not None:
                return found
        start = time.perf_counter()
        try:
            frontier = solve_frontier(model, pins, uniform, memory_resolution)
        except FrontierTooLargeError as refusal:
            if store is not None:
                try:
                    store.put_refusal(question, refusal, time.perf_counter() - start)
                except sqlite3.Error as err:
                    _not_kept(store_path, "written", err)
            raise _hinted(refusal, memory_resolution, uniform) from None
        solved = SolvedFrontier(frontier, time.perf_counter() - start, kept=False)
        if store is not None:
            try:
                store.put_frontier(question, solved)
            except sqlite3.Error as err:
                _not_kept(store_path, "written", err)
        return solved
    finally:
        if store is not None:
            store.close()


def _hinted(
    refusal: FrontierTooLargeError, memory_resolution: int, uniform: bool
) -> FrontierTooLargeError:
    """The refusal of an exact solve, with the way to an approximate one (the chain's: the
    uniform solver enumerates common configurations, which no resolution makes fewer)."""
    if memory_resolution or uniform:
        return refusal
    return FrontierTooLargeError(
        f"{refusal} Or solve it approximately, within a stated bound: "
        "analyze(..., memory_resolution='64MiB') (explorer plan --memory-resolution 64MiB)."
    )


def _opened(path: Path | None) -> FrontierStore | None:
    if path is None:
        return None
    try:
        return FrontierStore(path)
    except (OSError, sqlite3.Error) as err:
        _not_kept(path, "opened", err)
        return None


def _not_kept(path: Path | None, what: str, err: Exception) -> None:
    warnings.warn(
        f"frontier store {path} could not be {what} ({type(err).__name__}: {err}): the "
        "frontier is solved, not kept; make the file and its folder writable, or move it "
        "aside, to keep frontiers across runs",
        stacklevel=3,
    )
