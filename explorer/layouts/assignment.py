"""Per-value layouts made elsewhere (a per-op plan, the Alpa ILP's) -> a ShardingAssignment."""

from __future__ import annotations

from collections.abc import Mapping

from explorer.ir import DimAxes, Graph, ShardingAssignment, path_suffix
from explorer.mesh import MeshSpec


def replicated(rank: int) -> DimAxes:
    return ((),) * rank


def layout_assignment(
    graph: Graph,
    mesh: MeshSpec,
    values: Mapping[int, DimAxes],
    operands: Mapping[tuple[int, int], DimAxes] | None = None,
) -> ShardingAssignment:
    """A ShardingAssignment from per-value layouts (step inputs included).

    A step result that updates an input is stored in that input's layout (so the next step
    reads it as this one did); any other result leaves replicated.
    """
    inputs = tuple(values.get(v, replicated(graph.values[v].type.rank)) for v in graph.inputs)
    by_suffix = {
        (path_suffix(graph.values[v].path), graph.values[v].type.shape): dims
        for v, dims in zip(graph.inputs, inputs, strict=True)
    }
    paths = graph.output_paths or ("",) * len(graph.outputs)
    outputs = tuple(
        by_suffix.get(
            (path_suffix(path), graph.values[v].type.shape),
            replicated(graph.values[v].type.rank),
        )
        for v, path in zip(graph.outputs, paths, strict=True)
    )
    input_ids = set(graph.inputs)
    internal = tuple(sorted((v, d) for v, d in values.items() if v not in input_ids))
    wanted = tuple(sorted((o, p, d) for (o, p), d in (operands or {}).items()))
    return ShardingAssignment(mesh.axes, inputs, outputs, internal, wanted)
