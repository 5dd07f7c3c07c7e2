"""`fastest_plan`: the plan predicted fastest over several analyses of one step, chosen by
prediction within the budget, and refused before any solving where the analyses are not of
one step on one mesh."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import explorer as ex
from explorer.across_spaces import fastest_fit_on_gpu
from explorer.errors import InputError, NoPlanFitsError
from explorer.evaluation_store import EvaluationStore
from explorer.target_memory import target_memory
from tests.helpers import SHARED_CACHE


def _layers_as(role: str) -> Callable[[str, str, str], bool]:
    """Profile only the layer configurations that start with `role` (the rest of the step
    as usual): a narrow space, cheap to profile, whose plans all split the layers so."""

    def keep(kind: str, label: str, config: str) -> bool:
        return kind != "segment" or label != "layer" or config.startswith(role)

    return keep


@pytest.fixture(scope="module")
def two_spaces() -> tuple[ex.Analysis, ex.Analysis]:
    """Tiny GPT on 4 devices twice: its layers data parallel, and tensor parallel."""
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny())
    data = ex.analyze(
        step, *args, mesh=(4,), cache=SHARED_CACHE, progress=False, only=_layers_as("M@x")
    )
    tensor = ex.analyze(
        step, *args, mesh=(4,), cache=SHARED_CACHE, progress=False, only=_layers_as("N@x"),
        traced=data.graph,
    )  # fmt: skip
    return data, tensor


def test_the_plan_predicted_fastest_is_chosen_whatever_the_order(
    two_spaces: tuple[ex.Analysis, ex.Analysis],
) -> None:
    data, tensor = two_spaces
    assert data.plan().time < tensor.plan().time  # what the choice rests on
    for order in ([data, tensor], [tensor, data]):
        best = ex.fastest_plan(order)
        assert best.strategies == data.plan().strategies and best.time == data.plan().time


def test_under_a_budget_only_the_spaces_with_a_plan_within_it_compete(
    two_spaces: tuple[ex.Analysis, ex.Analysis],
) -> None:
    data, tensor = two_spaces
    # the tensor-parallel space's leanest plan needs more than the data-parallel one's
    assert data.frontier.min_memory < tensor.frontier.min_memory
    budget = (data.frontier.min_memory + tensor.frontier.min_memory) // 2
    best = ex.fastest_plan([tensor, data], memory_budget=budget)
    assert best.strategies == data.plan(memory_budget=budget).strategies
    assert best.memory <= budget and best.predicted.budget == budget
    with pytest.raises(NoPlanFitsError, match=r"no plan of the 2 spaces fits .* the smallest"):
        ex.fastest_plan([tensor, data], memory_budget=data.frontier.min_memory - 1)


def test_analyses_of_another_mesh_or_no_analysis_are_refused_before_solving(
    two_spaces: tuple[ex.Analysis, ex.Analysis],
) -> None:
    data, _ = two_spaces
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny())
    shape_only = ex.analyze(step, *args, mesh=(4,), profile=False, traced=data.graph)
    with pytest.raises(InputError, match=r"analyses\[1\]: expected an Analysis .* SegmentedStep"):
        ex.fastest_plan([data, shape_only])
    with pytest.raises(InputError, match="expected a non-empty sequence of Analysis"):
        ex.fastest_plan([])
    with pytest.raises(InputError, match="expected a non-empty sequence of Analysis"):
        ex.fastest_plan(data)  # type: ignore[arg-type]
    other = ex.analyze(
        step, *args, mesh=(2,), cache=SHARED_CACHE, progress=False, only=_layers_as("M@x"),
        traced=data.graph,
    )  # fmt: skip
    with pytest.raises(InputError, match=r"analyses\[1\] is of another mesh than analyses\[0\]"):
        ex.fastest_plan([data, other])


def test_judged_on_the_gpu_each_spaces_fit_competes_by_prediction(
    two_spaces: tuple[ex.Analysis, ex.Analysis], tmp_path: Path
) -> None:
    """`fastest_fit_on_gpu`: each space's fastest plan that fits XLA:GPU's memory, and of those
    the one predicted fastest; with no fit anywhere, an error that speaks for every space."""
    data, tensor = two_spaces
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny())
    with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
        for order in ([data, tensor], [tensor, data]):
            fit = fastest_fit_on_gpu(order, step, *args, store=store)
            assert fit.plan.strategies == data.plan().strategies  # both fit 40 GiB
            assert fit.memory.peak <= fit.budget  # the device's memory, given no budget
            assert fit.memory == target_memory(fit.plan, "a100-pcie-8", step, *args, store=store)
        every_space = r"2 spaces fits the GPU\. space 1: no plan fits .* space 2: no plan fits"
        with pytest.raises(NoPlanFitsError, match=every_space):
            fastest_fit_on_gpu([data, tensor], step, *args, memory_budget=1, store=store)
    with pytest.raises(InputError, match="expected a non-empty sequence of Analysis"):
        fastest_fit_on_gpu([], step, *args)
