"""Fig. 9 of the CFP paper: Alpa's prediction of each CFP configuration.

The op model of `ops` prices every configuration of every unique segment as its profiled
program runs, for the UI's bars and the bench to set beside the profiled cost.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from explorer.alpa.comm import _platform, comm_model
from explorer.alpa.ops import OpModel
from explorer.ir import DimAxes
from explorer.layouts import (
    configuration_name,
    instance_dependencies,
    loop_twins,
    replicated,
    twin_config,
)
from explorer.mesh import mesh_spec
from explorer.space import segment_input_layouts, shardings

if TYPE_CHECKING:
    import pandas as pd


def symbolic_config_costs(analysis: Any) -> pd.DataFrame:
    """Alpa-style communication cost of every configuration of every unique segment.

    `analysis` is a pipeline Analysis (read for `.graph`, `.block_analysis`, `.segments`,
    `.mesh`, `.platform`). Each configuration is priced as its profiled program runs: the
    first instance of the segment type, its blocks' layouts imposed, its boundary tensors
    arriving as `segment_input_layouts` gives them, every other op following its operands.
    Rows join `analysis.profiles` (kind "segment") on `segment` and `config`.
    """
    import pandas as pd

    graph = analysis.graph
    blocks = analysis.block_analysis.blocks
    segmentation = analysis.segments
    mesh = mesh_spec(analysis.mesh)
    model = OpModel(graph, mesh, comm_model(mesh, _platform(analysis.platform, False)))
    position = {vid: i for i, vid in enumerate(graph.inputs)}
    rows = []
    first: dict[int, Any] = {}
    for instance in segmentation.instances:
        first.setdefault(instance.unique_id, instance)
    dependencies = instance_dependencies(graph, analysis.block_analysis, segmentation, mesh)
    twins = loop_twins(graph, blocks)
    for unique in segmentation.unique:
        instance = first[unique.id]
        inside = set(instance.ops)
        depends = dependencies[instance.index]
        for choices, context in itertools.product(
            itertools.product(*(range(len(blocks[b].strategies)) for b in instance.blocks)),
            itertools.product(*(range(len(blocks[b].strategies)) for b in depends)),
        ):
            config = twin_config(twins, (*instance.blocks, *depends), (*choices, *context))
            assignment = shardings(graph, blocks, config, mesh)
            boundary = segment_input_layouts(
                graph, blocks, segmentation, instance.index, tuple(choices)
            )
            values = dict(assignment.values)
            arriving: dict[int, DimAxes] = {}
            for op_id in instance.ops:
                for vid in graph.ops[op_id].inputs:
                    producer = graph.values[vid].producer
                    if producer is not None and producer in inside:
                        continue
                    if vid in boundary:
                        arriving[vid] = boundary[vid]
                    elif vid in position:
                        arriving[vid] = assignment.inputs[position[vid]]
                    else:
                        arriving[vid] = values.get(vid, replicated(graph.values[vid].type.rank))
            fixed = {v: d for v, d in values.items() if graph.values[v].producer in inside}
            operand_layouts = {(o, p): d for o, p, d in assignment.operands if o in inside}
            cost = model.fixed_cost(instance.ops, arriving, fixed, operand_layouts)
            names = configuration_name(blocks, instance.blocks, tuple(choices), depends, context)
            rows.append(
                {
                    "segment": unique.id,
                    "label": unique.label,
                    "config": names,
                    "choices": tuple(choices),
                    "symbolic_cost": cost,
                }
            )
    return pd.DataFrame(rows, columns=["segment", "label", "config", "choices", "symbolic_cost"])
