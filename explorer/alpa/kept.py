"""Alpa ILP answers kept across runs, by a digest of the problem they answer.

Building and solving the ILP of a paper-scale step takes minutes on a CPU core (LLaMA-7B on a
2x4 mesh: 450,564 variables, 456 s, built twice because no plan fits the device), and a
benchmark asks the same question on every run. A store keeps each answer, the layouts it chose
with the ILP's report, or the budget error it raised, under a digest of everything that decides
it: the traced graph, the mesh, the platform's figures, the memory budget, the time limit, the
ILP's own code and SciPy's version (HiGHS). `solve_alpa_kept` consults the store it is given;
without one it solves every time, as `solve_alpa` does.

An answer found at the time limit is the one that run found, and a hit gives its warning again:
a faster machine might have found a better plan within the same limit.
"""

from __future__ import annotations

import hashlib
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from explorer.errors import AlpaBudgetError, AlpaTimeLimitWarning
from explorer.ir import DimAxes, Graph
from explorer.kept_rows import KeptRows
from explorer.mesh import mesh_spec
from explorer.plan_types import IlpReport


def _code_digest() -> str:
    """The ILP's code: a change to how it is built or solved makes every kept answer stale.
    This module only keeps answers and the package's `__init__` only names them: a change to
    either alone leaves them good."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        if path.name in (Path(__file__).name, "__init__.py"):
            continue
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_CODE = _code_digest()


@dataclass(frozen=True, slots=True)
class IlpAnswer:
    """What `solve_alpa` decided, without the problem it built to decide it: the ILP's report
    and the layouts a plan is made of (named as `AlpaSolution`'s)."""

    report: IlpReport  # its solve_seconds are the run's that solved it, kept or not
    layouts: tuple[tuple[int, DimAxes], ...]
    operands: tuple[tuple[int, int, DimAxes], ...]
    strategies: tuple[tuple[int, str], ...]
    warning: str | None = None  # the time-limit warning the solve gave, if any
    kept: bool = False  # read from a store, not solved in this process

    def layout_map(self) -> dict[int, DimAxes]:
        return dict(self.layouts)


def problem_digest(
    graph: Graph,
    mesh: Any,
    platform: Any,
    *,
    memory_budget: float | None,
    time_limit: float,
    defaults: bool,
) -> str:
    """What decides the ILP's answer: every op and value of the graph as the ILP reads them,
    the mesh, alpha and beta's source, the budget, the limit and the code that solves it."""
    import scipy

    from explorer.alpa.comm import _platform
    from explorer.evaluation_store import platform_key

    hasher = hashlib.sha256()
    for op in graph.ops:
        types = ([str(t) for t in op.input_types], [str(t) for t in op.output_types])
        fields = (op.primitive, op.params, op.inputs, op.outputs, types, op.role.name)
        hasher.update(repr((*fields, op.depth, op.forward_op)).encode())
    for value in graph.values:
        hasher.update(repr((str(value.type), value.kind.name, value.path)).encode())
    hasher.update(repr((graph.inputs, graph.outputs, graph.output_paths)).encode())
    resolved = _platform(platform, defaults)
    source = "alpa defaults" if resolved is None else platform_key(resolved.to_json())
    question = (mesh_spec(mesh).axes, source, memory_budget, time_limit, defaults)
    hasher.update(repr((*question, _CODE, scipy.__version__)).encode())
    return hasher.hexdigest()


class IlpAnswerStore(KeptRows):
    """An SQLite table of answers: problem digest -> the answer's fields or its budget error."""

    def __init__(self, path: str | Path) -> None:
        super().__init__(path, "answers", ("problem",))

    def get_answer(self, problem: str) -> IlpAnswer | AlpaBudgetError | None:
        return self.get((problem,), _answer_from)

    def put_answer(self, problem: str, answer: IlpAnswer | AlpaBudgetError) -> None:
        if isinstance(answer, AlpaBudgetError):
            fields: dict[str, Any] = {"budget_error": str(answer)}
        else:
            fields = asdict(answer)
            del fields["kept"]
        self.put((problem,), fields)


def _answer_from(fields: dict[str, Any]) -> IlpAnswer | AlpaBudgetError:
    if "budget_error" in fields:
        return AlpaBudgetError(str(fields["budget_error"]))

    def axes(dims: list[list[str]]) -> DimAxes:
        return tuple(tuple(str(name) for name in dim) for dim in dims)

    return IlpAnswer(
        report=IlpReport(**fields["report"]),
        layouts=tuple((int(v), axes(dims)) for v, dims in fields["layouts"]),
        operands=tuple((int(o), int(p), axes(dims)) for o, p, dims in fields["operands"]),
        strategies=tuple((int(o), str(name)) for o, name in fields["strategies"]),
        warning=fields["warning"],
        kept=True,
    )


def solve_alpa_kept(
    graph: Graph,
    mesh: Any,
    platform: Any,
    *,
    memory_budget: float | None = None,
    time_limit: float = 60.0,
    defaults: bool = False,
    store: IlpAnswerStore | None = None,
) -> IlpAnswer:
    """`solve_alpa`'s answer, from `store` when it holds it (its time-limit warning and its
    budget error given again), else solved and kept there (without a store: solved)."""
    from explorer.alpa.solve import solve_alpa

    question: dict[str, Any] = dict(
        memory_budget=memory_budget, time_limit=time_limit, defaults=defaults
    )
    problem = problem_digest(graph, mesh, platform, **question) if store is not None else ""
    found = store.get_answer(problem) if store is not None else None
    if isinstance(found, AlpaBudgetError):
        raise found
    if found is not None:
        if found.warning is not None:
            warnings.warn(found.warning, AlpaTimeLimitWarning, stacklevel=2)
        return found
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AlpaTimeLimitWarning)
        try:
            solution = solve_alpa(graph, mesh, platform, **question)
        except AlpaBudgetError as err:
            if store is not None:
                store.put_answer(problem, err)
            raise
    for each in caught:  # what the solve warned is the caller's to see, as without a store
        warnings.warn_explicit(each.message, each.category, each.filename, each.lineno)
    said = [w for w in caught if issubclass(w.category, AlpaTimeLimitWarning)]
    report = IlpReport(
        objective=solution.objective,
        units=solution.units,
        status=solution.status,
        solve_seconds=solution.solve_seconds,
        variables=solution.variables,
        integer_variables=solution.integer_variables,
        constraints=solution.constraints,
        memory=solution.memory,
    )
    answer = IlpAnswer(
        report,
        solution.layouts,
        solution.operands,
        solution.strategies,
        warning=str(said[0].message) if said else None,
    )
    if store is not None:
        store.put_answer(problem, answer)
    return answer
