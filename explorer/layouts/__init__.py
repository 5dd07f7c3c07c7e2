"""Placement: one layout for every value of the step under a Config.

`place` (in `placement`, whose doc gives the rules) constrains segment boundaries, lets every
op outside the blocks follow an operand, pulls splits into replicated ops and fixes the layout
each op reads, so the program that runs is the program whose pieces were priced.
`dependencies` says which blocks of other segment instances change an instance's program (by
their scan twins) and names segment configurations. `layout_assignment` (in `assignment`)
turns per-value layouts made elsewhere (a per-op plan, the Alpa ILP's) into a
ShardingAssignment.
"""

from explorer.layouts.assignment import layout_assignment, replicated
from explorer.layouts.dependencies import (
    CONTEXT_SEPARATOR,
    configuration_name,
    external_blocks,
    instance_dependencies,
    loop_twins,
    split_by_dependencies,
    twin_config,
)
from explorer.layouts.placement import (
    MOVED_ONCE,
    PARTIAL_REDUCTIONS,
    Placement,
    boundary_reads,
    boundary_shared_moves,
    place,
    shared_moves,
)

__all__ = [
    "CONTEXT_SEPARATOR",
    "MOVED_ONCE",
    "PARTIAL_REDUCTIONS",
    "Placement",
    "boundary_reads",
    "boundary_shared_moves",
    "configuration_name",
    "external_blocks",
    "instance_dependencies",
    "layout_assignment",
    "loop_twins",
    "place",
    "replicated",
    "shared_moves",
    "split_by_dependencies",
    "twin_config",
]
