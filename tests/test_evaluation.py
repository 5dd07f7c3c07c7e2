"""`evaluate_each`: several plans of one step compiled at once in the compile workers, with
the answers `evaluate_on` gives one plan at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import optax
import pytest
from helpers import mlp_step

import explorer as ex
from explorer.evaluation_store import EvaluationStore
from explorer.plan import PlanError, evaluate_each, evaluate_on

PLATFORM = "a100-pcie-8"


def _args(batch: int) -> tuple[Any, ...]:
    params = {"w_in": jnp.ones((64, 128)), "w_out": jnp.ones((128, 64))}
    return params, optax.sgd(0.1).init(params), jnp.ones((batch, 64))


def test_each_plan_is_answered_as_alone_and_a_failure_stops_only_its_plan(tmp_path: Path) -> None:
    args = _args(16)
    step = ex.analyze(mlp_step, *args, mesh=(4,), platform=PLATFORM, profile=False)
    plans = [step.baseline(name) for name in ("dp", "megatron", "fsdp")]
    alone = [evaluate_on(plan, [PLATFORM], mlp_step, *args) for plan in plans]
    assert [a[PLATFORM].time for a in alone] == [p.time for p in plans]  # the baselines' own
    assert evaluate_each(plans, [PLATFORM], mlp_step, *args) == alone

    # a plan of another step (another batch) fails where it is lowered, the others go on
    stranger = ex.analyze(mlp_step, *_args(32), mesh=(4,), platform=PLATFORM, profile=False)
    mixed = [plans[0], stranger.baseline("dp"), plans[1]]
    failures: list[tuple[int, Exception]] = []
    answers = evaluate_each(
        mixed, [PLATFORM], mlp_step, *args, on_error=lambda i, e: failures.append((i, e))
    )
    assert answers == [alone[0], None, alone[1]]
    assert [i for i, _ in failures] == [1] and isinstance(failures[0][1], PlanError)
    with pytest.raises(PlanError, match="the plan was made for model"):
        evaluate_each(mixed, [PLATFORM], mlp_step, *args)

    # with a store the answers are kept, and read back without lowering the step again
    with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
        assert evaluate_each(plans, [PLATFORM], mlp_step, *args, store=store) == alone
        assert evaluate_each(plans, [PLATFORM], _never_lowered, *args, store=store) == alone


def _never_lowered(*args: Any) -> Any:
    raise AssertionError("the store holds this plan's evaluation: nothing to lower")


def test_a_stopped_compile_is_refused_under_a_limit_a_few_pages_higher(tmp_path: Path) -> None:
    """Half of two machines of one size differs by a few pages: a compile stopped at one
    limit is not tried again under the other, only under a limit clearly higher."""
    stopped = 12_637_986_816
    with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
        store.keep_stopped_compile("step", stopped, "grew past the limit")
        assert store.stopped_compile("step", stopped) == "grew past the limit"
        assert store.stopped_compile("step", stopped + 8192) == "grew past the limit"
        assert store.stopped_compile("step", stopped // 2) == "grew past the limit"
        assert store.stopped_compile("step", int(stopped * 1.1)) is None
        assert store.stopped_compile("another step", stopped) is None


def test_a_compile_stopped_for_memory_is_kept_and_not_compiled_again_under_that_limit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A step whose compile ran into the workers' memory limit would run into it again, after
    as many minutes: a store keeps the stop, and the same limit refuses the step at once
    (saying so), while a higher limit compiles it. Real workers: the starved limit is below
    what a worker holds once JAX is imported, so its first compile is stopped."""
    import jax

    from explorer.profile import backends
    from explorer.profile.compile_workers import CompileOutOfMemory, CompileWorkers

    args = _args(16)
    plan = ex.analyze(mlp_step, *args, mesh=(4,), platform=PLATFORM, profile=False).baseline("dp")
    starved = CompileWorkers(processes=1, device_count=jax.device_count(), memory_limit=2**26)
    roomy = CompileWorkers(processes=1, device_count=jax.device_count(), memory_limit=2**40)
    pools = {"now": starved}
    monkeypatch.setattr(backends, "compile_workers", lambda kind, threads: pools["now"])
    try:
        with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
            with pytest.raises(CompileOutOfMemory, match=r"grew past the 0\.1 GiB") as first:
                evaluate_on(plan, [PLATFORM], mlp_step, *args, store=store)
            assert "not compiled again" not in str(first.value) and starved.started == 1
            # asked again, alone or among others: refused from the store, nothing compiled
            refused = r"^not compiled again: an earlier run"
            with pytest.raises(CompileOutOfMemory, match=refused) as again:
                evaluate_on(plan, [PLATFORM], mlp_step, *args, store=store)
            assert str(first.value) in str(again.value)
            failures: list[tuple[int, Exception]] = []
            answers = evaluate_each(
                [plan], [PLATFORM], _never_lowered, *args, store=store,
                on_error=lambda i, e: failures.append((i, e)),
            )  # fmt: skip
            assert answers == [None] and [i for i, _ in failures] == [0]
            assert str(failures[0][1]).startswith("not compiled again")
            assert starved.started == 1
            # more memory: compiled, and answered as without a store
            pools["now"] = roomy
            evaluated = evaluate_on(plan, [PLATFORM], mlp_step, *args, store=store)
            assert evaluated[PLATFORM].time == plan.time
            assert roomy.started == 1
    finally:
        starved.close()
        roomy.close()
