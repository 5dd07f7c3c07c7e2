"""The flat program the rest of the package sees: equations over integer value ids, and the
scans unrolled into it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax


@dataclass(frozen=True, slots=True)
class FlatEqn:
    """One primitive application with its operands renamed to integer value ids.

    `invars` entries are value ids; literals and closed-over constants are values too (their
    content sits in `FlatProgram.constants`).
    """

    primitive: Any  # jax Primitive, kept to re-bind the op when realising a sharded program
    params: dict[str, Any]
    invars: tuple[int, ...]
    outvars: tuple[int, ...]
    name_stack: str
    source: str
    source_line: str


@dataclass(frozen=True, slots=True)
class LoopIteration:
    """One unrolled iteration of a scan: which flat values its body read and made.

    `inputs` are the flat ids bound to the body's invars (consts, carry, then the slices of
    the scanned operands at `index`), `outputs` the flat ids of its outvars (carry, then the
    per-iteration ys), `values` the flat id of every outvar of every top-level body equation,
    in body order. The body's own equations are the flat equations `start` to `stop - 1`
    (slicing and stacking, which the tracer adds, lie outside that range).
    """

    index: int  # position along the scanned axis
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    values: tuple[int, ...]
    start: int
    stop: int


@dataclass(frozen=True, slots=True)
class LoopRegion:
    """A `scan` of the step, unrolled into the flat program at equations `start` to `stop - 1`.

    `params` are the scan equation's own (its closed body `jaxpr`, `length`, `reverse`,
    `num_consts`, `num_carry`, ...); `operands` and `results` are the flat ids of what it read
    and made (final carry, then the stacked ys); `iterations` are in execution order (for a
    `reverse` scan, the last index first). `depth` is 0 for a scan of the step itself, one
    more for each scan whose body holds it.
    """

    params: dict[str, Any]
    operands: tuple[int, ...]
    results: tuple[int, ...]
    start: int
    stop: int
    iterations: tuple[LoopIteration, ...]
    depth: int
    name_stack: str
    source_line: str

    def __post_init__(self) -> None:
        if len(self.iterations) != self.length:
            raise ValueError(
                f"scan at {self.source_line}: expected {self.length} iterations, found "
                f"{len(self.iterations)}"
            )

    @property
    def length(self) -> int:
        return int(self.params["length"])

    @property
    def reverse(self) -> bool:
        return bool(self.params["reverse"])

    @property
    def num_consts(self) -> int:
        return int(self.params["num_consts"])

    @property
    def num_carry(self) -> int:
        return int(self.params["num_carry"])

    def iteration_of(self, eqn_index: int) -> tuple[int, int] | None:
        """(iteration position, offset in its body) of a body equation, None elsewhere."""
        for position, iteration in enumerate(self.iterations):
            if iteration.start <= eqn_index < iteration.stop:
                return position, eqn_index - iteration.start
        return None


@dataclass(frozen=True, slots=True)
class FlatProgram:
    """An inlined jaxpr: equations in topological order over integer value ids.

    `loops` records every scan the tracer unrolled (outermost after the scans its body
    holds); a program without scans has none.
    """

    eqns: tuple[FlatEqn, ...]
    invars: tuple[int, ...]
    outvars: tuple[int, ...]
    avals: tuple[tuple[tuple[int, ...], str], ...]  # (shape, dtype name) per value id
    constants: dict[int, Any]  # value id -> concrete constant (literals, closed-over consts)
    dtypes: tuple[Any, ...] = ()  # the dtype objects themselves (PRNG key types included)
    loops: tuple[LoopRegion, ...] = ()

    def subprogram(self, eqn_indices: Sequence[int]) -> FlatProgram:
        """The equations at `eqn_indices` as a program of their own.

        Inputs: every value they read but do not make (constants excluded); outputs: every
        value they make that an equation outside the selection, or the whole program, reads.
        """
        chosen = sorted(set(eqn_indices))
        inside = set(chosen)
        made: set[int] = set()
        inputs: list[int] = []
        for index in chosen:
            for vid in self.eqns[index].invars:
                if vid not in made and vid not in self.constants and vid not in inputs:
                    inputs.append(vid)
            made.update(self.eqns[index].outvars)
        read_outside = set(self.outvars)
        for index, eqn in enumerate(self.eqns):
            if index not in inside:
                read_outside.update(v for v in eqn.invars if v in made)
        outputs = [v for i in chosen for v in self.eqns[i].outvars if v in read_outside]
        return FlatProgram(
            eqns=tuple(self.eqns[i] for i in chosen),
            invars=tuple(inputs),
            outvars=tuple(dict.fromkeys(outputs)),
            avals=self.avals,
            constants=self.constants,
            dtypes=self.dtypes,
        )

    def abstract(self, vid: int, sharding: Any = None) -> Any:
        shape, _ = self.avals[vid]
        return jax.ShapeDtypeStruct(shape, self.dtypes[vid], sharding=sharding)
