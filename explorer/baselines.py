"""Template baselines, in the same Plan format and priced by the same cost model.

- `dp`: data parallel, every block splits its batch (M) over the whole mesh.
- `fsdp`: FSDP / ZeRO-3, computing like `dp` with parameters and optimizer state sharded over
  the whole mesh. Its layouts are not a block configuration, so the profiles cannot price it:
  its prediction is the whole step compiled and priced (`evaluate`).
- `megatron`: tensor parallel as Megatron-LM does it: within each segment, blocks alternate a
  column split (N: QKV, MLP-in) and a row split (K: attention-out, MLP-out), so each pair needs
  one all-reduce; a block on its own (the LM head) is split by columns (vocab-parallel). On a
  2-D mesh this is DP x TP: batch over the outer axis, the tensor split over the inner one.
- `alpa`: Alpa's intra-operator ILP over per-op strategies with a communication-volume cost
  model (explorer.alpa); its plan is a layout per value, not a block configuration, so
  `Analysis.baseline("alpa")` builds it and `baseline_choices` has none to give.
"""

from __future__ import annotations

from explorer.errors import AnalysisError
from explorer.ir import (
    BlockAnalysis,
    DimAxes,
    DimRole,
    Graph,
    ParallelBlock,
    Segmentation,
    ValueKind,
)
from explorer.mesh import MeshSpec

BASELINES = ("dp", "megatron", "fsdp", "alpa")


def baseline_choices(
    name: str, analysis: BlockAnalysis, segmentation: Segmentation
) -> tuple[int, ...]:
    """A strategy index per block for the named baseline."""
    if name in ("dp", "fsdp"):  # FSDP computes like DP; its parameters live sharded
        return tuple(_find(b, DimRole.M, name) for b in analysis.blocks)
    if name == "megatron":
        choices = [0] * len(analysis.blocks)
        for instance in segmentation.instances:
            alone = len(instance.blocks) == 1
            for position, index in enumerate(instance.blocks):
                role = DimRole.N if alone or position % 2 == 0 else DimRole.K
                choices[index] = _find(analysis.blocks[index], role, name)
        return tuple(choices)
    if name == "alpa":
        raise AnalysisError(
            "baseline 'alpa' chooses a layout per op, not a strategy per block: use "
            "Analysis.baseline('alpa') or explorer.alpa.solve_alpa"
        )
    raise AnalysisError(f"unknown baseline {name!r}; expected one of {', '.join(BASELINES)}")


def fsdp_parameter_layouts(graph: Graph, mesh: MeshSpec) -> dict[str, DimAxes]:
    """ZeRO-3: each parameter split over the whole mesh along its first dim that divides.

    The partitioner then all-gathers a weight where a block uses it and reduce-scatters its
    gradient; optimizer state follows the parameter (see space.shardings).
    """
    layouts: dict[str, DimAxes] = {}
    for value in graph.inputs_of_kind(ValueKind.PARAMETER):
        dims: list[tuple[str, ...]] = [()] * value.type.rank
        for dim, size in enumerate(value.type.shape):
            if size % mesh.size == 0:
                dims[dim] = mesh.names
                break
        layouts[value.path] = tuple(dims)
    return layouts


def _find(block: ParallelBlock, role: DimRole, name: str) -> int:
    """The strategy whose innermost mesh axis splits `role` (DP x TP on 2-D), its
    parameters kept where it computes with them (not a ZeRO twin), its partial sums
    all-reduced (not a scattering twin)."""
    plain = [(i, s) for i, s in enumerate(block.strategies) if not (s.stored or s.scattered)]
    for index, strategy in plain:
        if strategy.assignment and strategy.assignment[-1][0] is role:
            return index
    if role in (DimRole.K, DimRole.N):  # fall back to data parallel where TP can't
        for index, strategy in plain:
            if strategy.assignment and strategy.assignment[-1][0] is DimRole.M:
                return index
    if block.strategies:
        return 0
    raise AnalysisError(f"baseline {name!r}: block {block.index} has no strategy")
