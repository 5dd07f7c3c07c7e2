"""A plan's memory on the platform's GPU, from XLA:GPU compiling the step without a GPU."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jax
import pytest
from helpers import SHARED_CACHE

import explorer as ex
from explorer.errors import NoPlanFitsError, PlatformError, TargetCompilerError
from explorer.evaluation import lower_step
from explorer.evaluation_store import EvaluationStore
from explorer.target_memory import fastest_plan_on_gpu, target_memory

ROOT = Path(__file__).resolve().parents[1]


# plans of test_alpa's MLP on mesh 4 (see test_plan_document): nothing to profile
GOLDEN = Path(__file__).parent / "golden" / "plans"


@cache
def _mlp() -> tuple[Any, Any]:
    from test_alpa import _mlp_graph

    step, args, _ = _mlp_graph(8, 64, 64)
    return step, args


def _shard_bytes(plan: Any, step: Any, args: Any) -> int:
    """What one device holds of the step's inputs under the plan: every input's shard."""
    lowered = lower_step(plan, step, args)
    return sum(
        math.prod(leaf.sharding.shard_shape(leaf.shape)) * leaf.dtype.itemsize
        for leaf in lowered.leaves
    )


def test_a_plans_gpu_memory_is_xla_gpus_analysis_of_the_step_under_it(tmp_path: Path) -> None:
    step, args = _mlp()
    replicated, split = ex.load_plan(GOLDEN / "dp.json"), ex.load_plan(GOLDEN / "megatron.json")
    with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
        found = {}
        for name, plan in (("dp", replicated), ("megatron", split)):
            memory = target_memory(plan, "a100-pcie-8", step, *args, store=store)
            assert memory.gpu == "A100-PCIe-40GB"
            # XLA:GPU's program takes each input's shard under the plan, nothing more
            assert memory.arguments == _shard_bytes(plan, step, args)
            # parameters and optimizer state are donated: updated in place, counted once
            assert 0 < memory.aliased <= memory.outputs
            assert memory.temporaries > 0
            assert memory.peak == (
                memory.arguments + memory.outputs + memory.temporaries - memory.aliased
            )
            found[name] = memory
        assert store.hits == 0
        # kept by the plan's program and the GPU: asked again, nothing is compiled
        assert target_memory(split, "a100-pcie-8", step, *args, store=store) == found["megatron"]
        assert store.hits == 1
    # Megatron splits the weights four ways, data parallelism holds them whole
    assert found["megatron"].arguments < found["dp"].arguments / 2


def test_a_platform_whose_device_is_no_known_gpu_is_refused_before_compiling() -> None:
    step, args = _mlp()
    with pytest.raises(PlatformError, match=r"'cpu-local'.*is not a GPU.*A100-PCIe-40GB"):
        target_memory(ex.load_plan(GOLDEN / "cfp.json"), "cpu-local", step, *args)


def test_a_gpu_the_installed_cuda_cannot_compile_for_is_refused_naming_what_can() -> None:
    from explorer._jax_compat.deviceless import plugin_versions

    _, cuda = plugin_versions()
    if cuda[0] < 13:
        pytest.skip(f"the installed CUDA plugin (CUDA {cuda[0]}) still compiles for Volta")
    step, args = _mlp()
    with pytest.raises(
        TargetCompilerError,
        match=r"V100-SXM2-16GB \(compute capability 7\.0\).*CUDA 13.*jax-cuda12-plugin",
    ):
        target_memory(ex.load_plan(GOLDEN / "dp.json"), "v100-nvlink-4", step, *args)


_WITHOUT_PLUGIN = """
import sys
sys.modules["jax_cuda13_plugin"] = None  # as where the gpu-target extra is not installed
import explorer as ex
from explorer.errors import TargetCompilerError
from explorer.target_memory import fastest_plan_on_gpu, target_memory
try:  # refused before the step is traced
    target_memory(ex.load_plan(sys.argv[1]), "a100-pcie-8", lambda *args: None)
except TargetCompilerError as err:
    print("refused:", err)
"""


def test_without_the_cuda_plugin_the_error_says_how_to_install_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PLUGIN, str(GOLDEN / "dp.json")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: compiling for a GPU without one needs JAX's CUDA plugin" in done.stdout
    assert f"jax-cuda13-plugin=={jax.__version__}" in done.stdout


def test_the_fastest_plan_on_the_gpu_fits_and_every_faster_one_compiled_does_not(
    tmp_path: Path,
) -> None:
    # tiny GPT as test_plan analyses it (the session cache serves both): 3 frontier plans
    step, args = ex.models.gpt(ex.models.GPTConfig.tiny().replace(num_layers=2))
    analysis = ex.analyze(
        step, *args, mesh=(4,), platform="a100-pcie-8", cache=SHARED_CACHE, progress=False
    )
    points = analysis.frontier.points
    assert len(points) > 1  # a frontier to search
    with EvaluationStore(tmp_path / "evaluations.sqlite") as store:
        peaks = [
            target_memory(analysis.plan_of(p.selection), "a100-pcie-8", step, *args, store=store)
            for p in points
        ]
        # a budget the fastest plan misses: the search must go down the frontier
        budget = sorted(m.peak for m in peaks)[len(peaks) // 2]
        fit = fastest_plan_on_gpu(analysis, step, *args, memory_budget=budget, store=store)
        assert fit.memory.peak <= fit.budget == budget
        assert fit.memory == target_memory(fit.plan, "a100-pcie-8", step, *args, store=store)
        assert all(peak > budget for time, _, peak in fit.compiled if time < fit.plan.time)
        assert len(fit.compiled) <= 2 + math.ceil(math.log2(len(points)))
        too_small = min(m.peak for m in peaks) - 1
        with pytest.raises(NoPlanFitsError, match=r"no plan fits .* on A100-PCIe-40GB"):
            fastest_plan_on_gpu(analysis, step, *args, memory_budget=too_small, store=store)
