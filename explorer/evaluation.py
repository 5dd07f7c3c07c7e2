"""Evaluation: the whole step compiled under a plan and priced on a platform, the ground truth
predictions are judged on. One compilation prices on any number of platforms (the compiled
program does not depend on the platform); an `EvaluationStore`, when given, keeps
evaluations across runs, keyed by the program and the platform's content.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import jax

from explorer import _jax_compat as jc
from explorer.evaluation_store import EvaluationStore, layout_digest, platform_key
from explorer.ir import Graph, ShardingAssignment
from explorer.mesh import make_mesh
from explorer.plan_document import _check_plan_and_step, plan_to_json
from explorer.plan_types import Plan
from explorer.profile.compile_workers import CompileOutOfMemory, CompileWorkers
from explorer.realize import realize

if TYPE_CHECKING:
    from explorer.platforms import Platform

# what `evaluate_on` is given per platform, and keys its answers by
PlatformKey = TypeVar("PlatformKey", bound="Platform | str | Path")


@dataclass(frozen=True, slots=True)
class Evaluation:
    """The whole step compiled under a plan and priced on the plan's platform."""

    time: float
    t_comm: float
    t_comp: float
    memory: int
    collectives: int
    # (kind, bytes, mesh axes, group size) of every collective the compiled step emits
    emitted: tuple[tuple[str, int, tuple[str, ...], int], ...] = ()


def evaluate(
    plan: Plan, step: Callable[..., Any], *args: Any, store: EvaluationStore | None = None
) -> Evaluation:
    """Ground truth for a plan: compile the whole step and price it with the same backend,
    on the platform the plan records (never a platform looked up again by its name).
    `store` keeps compiled evaluations across runs (see `evaluate_on`)."""
    _check_plan_and_step(plan, step, "evaluate")
    platform = plan.platform
    return evaluate_on(plan, [platform], step, *args, store=store)[platform]


@dataclass(frozen=True)
class LoweredStep:
    """The training step lowered under a plan, as `evaluate_on` compiles it."""

    graph: Graph
    assignment: ShardingAssignment
    realised: Any
    leaves: tuple[Any, ...]  # flat abstract inputs, so `measure` builds one array per leaf
    lowered: Any


def lower_step(
    plan: Plan,
    step: Callable[..., Any],
    args: tuple[Any, ...],
    devices: Sequence[Any] | None = None,
) -> LoweredStep:
    """`step` configured by `plan`, realised and lowered from abstract inputs, on `devices`
    (default: the devices JAX sees)."""
    from explorer.plan import _configure  # applying a plan; it re-exports this module

    graph, assignment = _configure(plan, step, args)
    # unrolled (realize's default): XLA's cost analysis counts a while loop's body once,
    # not once per trip, so only the unrolled step prices as the scan runs.
    # donated as a training loop donates: the step holds its parameters and optimizer state
    # once, which is what the composed memory predicts
    realised = realize(graph, assignment, make_mesh(plan.mesh, devices), donate=True)
    abstract = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), args, realised.in_shardings
    )
    leaves = tuple(jax.tree_util.tree_leaves(abstract))
    with jc.random_bits_as_accelerators_lower():  # as the platform priced lowers them
        lowered = realised.flat_fn.lower(*leaves)
    return LoweredStep(graph, assignment, realised, leaves, lowered)


def evaluate_on(
    plan: Plan,
    platforms: Sequence[PlatformKey],
    step: Callable[..., Any],
    *args: Any,
    backend: str = "compiled",
    store: EvaluationStore | None = None,
) -> dict[PlatformKey, Evaluation]:
    """`evaluate` priced on each of `platforms` (`Platform` objects, preset names or files),
    from one compilation: the compiled program does not depend on the platform, only its
    pricing does. The answer is keyed by what was given. With `backend="measured"` the step
    runs on the devices JAX sees and is timed instead (the platform then only splits the time
    into communication and computation). `store` keeps compiled evaluations across runs:
    the step is compiled only where it holds none of the plan's program on every platform
    (a measured one is never kept: it is this machine's, not a platform's)."""
    from explorer.platforms import resolve_platform
    from explorer.profile.backends import (
        Backend,
        compile_program,
        compile_workers,
        measure,
    )

    kind = Backend(backend)
    targets = {given: resolve_platform(given, "evaluate_on: platforms") for given in platforms}
    kept = _kept_evaluations(plan, targets, store) if kind is Backend.COMPILED else None
    if kept is not None:  # every platform's evaluation of this program is in the store
        return kept
    workers = compile_workers(kind, 1)  # None for a measured step: nothing to refuse
    _refuse_if_stopped(plan, store, _limit_of(workers))
    under = lower_step(plan, step, args)
    if kind is Backend.MEASURED:
        executable = compile_program(under.lowered, kind)
        return {
            given: _evaluation(
                measure(executable, under.leaves, p, plan.mesh, donated=under.realised.donated)
            )
            for given, p in targets.items()
        }
    text = _compiled_text(plan, under.lowered, workers, store)
    return _priced(plan, text, targets, store)


def evaluate_each(
    plans: Sequence[Plan],
    platforms: Sequence[PlatformKey],
    step: Callable[..., Any],
    *args: Any,
    backend: str = "compiled",
    store: EvaluationStore | None = None,
    on_error: Callable[[int, Exception], None] | None = None,
) -> list[dict[PlatformKey, Evaluation] | None]:
    """`evaluate_on` for several plans of one step, in their order, with the same answers.
    With the compiled backend each step is lowered here while the steps before it compile in
    the compile workers, several at once as in profiling (compiling is most of an
    evaluation of a small step); measured steps run one by one. A plan whose evaluation
    fails is passed with its error to `on_error` and answered None; without `on_error` the
    first failure is raised (after the compiles in flight end)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from explorer.platforms import resolve_platform
    from explorer.profile.backends import Backend, compile_to_text, compile_workers

    answers: list[dict[PlatformKey, Evaluation] | None] = [None] * len(plans)

    def failed(index: int, err: Exception) -> None:
        if on_error is None:
            raise err
        on_error(index, err)

    targets = {given: resolve_platform(given, "evaluate_each: platforms") for given in platforms}
    kind = Backend(backend)
    workers = compile_workers(kind, os.cpu_count() or 1)
    if kind is not Backend.COMPILED or workers is None:
        for index, plan in enumerate(plans):
            try:
                answers[index] = evaluate_on(
                    plan, platforms, step, *args, backend=backend, store=store
                )
            except Exception as err:
                failed(index, err)
        return answers
    in_flight: dict[int, Future[Any]] = {}

    def settle(index: int) -> None:
        try:
            answers[index] = _priced(plans[index], in_flight.pop(index).result(), targets, store)
        except CompileOutOfMemory as err:
            _keep_stop(plans[index], store, err, workers.memory_limit)
            failed(index, err)
        except Exception as err:
            failed(index, err)

    parallel = workers.processes
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        try:
            for index, plan in enumerate(plans):
                try:
                    answers[index] = _kept_evaluations(plan, targets, store)
                    if answers[index] is not None:
                        continue
                    _refuse_if_stopped(plan, store, workers.memory_limit)
                    lowered = lower_step(plan, step, args).lowered
                except Exception as err:
                    failed(index, err)
                    continue
                in_flight[index] = pool.submit(compile_to_text, lowered, workers)
                # a lowered step can be large: no more of them wait than the pool compiles
                while len(in_flight) > parallel:
                    settle(min(in_flight))
            while in_flight:
                settle(min(in_flight))
        finally:
            for future in in_flight.values():
                future.cancel()
    return answers


def _compiled_text(
    plan: Plan, lowered: Any, workers: CompileWorkers | None, store: EvaluationStore | None
) -> Any:
    """`lowered` compiled by `workers`; a compile stopped for its memory is kept in `store`."""
    from explorer.profile.backends import compile_to_text

    try:
        return compile_to_text(lowered, workers)
    except CompileOutOfMemory as err:
        _keep_stop(plan, store, err, _limit_of(workers))
        raise


def _limit_of(workers: CompileWorkers | None) -> int | None:
    """The memory a compile of `workers` may hold; None where programs compile here."""
    return workers.memory_limit if workers is not None else None


def _refuse_if_stopped(plan: Plan, store: EvaluationStore | None, limit: int | None) -> None:
    """Raise again the `CompileOutOfMemory` an earlier run kept for `plan`'s step, where the
    compile workers may hold no clearly higher memory now than when it was stopped
    (`units.MEMORY_LIMIT_MARGIN`): such a compile runs for minutes to be stopped the same
    way (BERT-large fp16 at batch 8 on 4 devices: its FSDP step grew past 20 GiB in 8 minutes
    of compiling). Under a clearly higher limit (`limit`, the workers' now; None: compiled
    here, never stopped) it is tried."""
    if store is None or limit is None:
        return
    why = store.stopped_compile(_program_digest(plan), limit)
    if why is not None:
        # said first: a report that shows an error's opening says that nothing was compiled
        raise CompileOutOfMemory(
            "not compiled again: an earlier run kept in the store stopped this step's compile "
            f"(it is not tried again under a limit no higher): {why}"
        )


def _keep_stop(
    plan: Plan, store: EvaluationStore | None, err: CompileOutOfMemory, limit: int | None
) -> None:
    if store is not None and limit is not None:
        store.keep_stopped_compile(_program_digest(plan), limit, str(err))


def _priced(
    plan: Plan, text: Any, targets: Mapping[PlatformKey, Platform], store: EvaluationStore | None
) -> dict[PlatformKey, Evaluation]:
    """The compiled step `text` of `plan` priced on each of `targets`, kept in `store`."""
    from explorer.profile.backends import price_compiled

    out = {given: _evaluation(price_compiled(text, p, plan.mesh)) for given, p in targets.items()}
    if store is not None:
        for given, evaluation in out.items():
            key = (_program_digest(plan), platform_key(targets[given].to_json()))
            store.put(key, asdict(evaluation))
    return out


def _evaluation(priced: Any) -> Evaluation:
    from explorer.profile.hlo import emitted

    return Evaluation(
        time=priced.t_comm + priced.t_comp,
        t_comm=priced.t_comm,
        t_comp=priced.t_comp,
        memory=priced.memory,
        collectives=len(priced.collectives),
        emitted=emitted(priced.collectives),
    )


def _program_digest(plan: Plan) -> str:
    """What decides the compiled step: the plan's layouts, how programs are built, JAX."""
    from explorer.profile.runner import program_version

    version = program_version(plan.mesh)
    return f"{layout_digest(plan_to_json(plan))}:{version}:jax-{jax.__version__}"


def _kept_evaluations(
    plan: Plan, targets: Mapping[PlatformKey, Platform], store: EvaluationStore | None
) -> dict[PlatformKey, Evaluation] | None:
    """The store's evaluations of `plan` on every one of `targets`, or None (compile)."""
    if store is None:
        return None
    found = {}
    for given, platform in targets.items():
        key = (_program_digest(plan), platform_key(platform.to_json()))
        evaluation = store.get(key, _evaluation_from)
        if evaluation is None:
            return None
        found[given] = evaluation
    return found


def _evaluation_from(fields: dict[str, Any]) -> Evaluation:
    emitted = tuple(
        (str(kind), int(nbytes), tuple(str(a) for a in axes), int(group))
        for kind, nbytes, axes, group in fields.pop("emitted")
    )
    return Evaluation(**fields, emitted=emitted)
