"""The Alpa-style ILP's problem, before it is formulated: ops grouped by the choice they share.

A step input or a contraction starts a group; every op that follows an operand joins its
leader's group (see `ops`), so a group has one strategy per choice of its leader. `_Builder`
sums the node costs of each group's strategies, the edge cost matrices between groups (the
resharding of each value from its producer's layout to what its reader wants, and of each
step result to the layout of the input it updates), and the per-device bytes alive at each
program point for the memory constraint; it re-prices any choice (`objective`, `peak`).
`AlpaProblem` reports the size of the ILP that `ilp.build_problem` formulates from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from explorer.alpa.ops import OpModel, OpStrategy, layout_name
from explorer.ir import DimAxes, Graph, path_suffix
from explorer.layouts import replicated
from explorer.mesh import MeshSpec


@dataclass(slots=True)
class _Node:
    op: int | None  # None for a step input
    value: int | None  # the input's value id
    group: int
    strategies: list[OpStrategy]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AlpaProblem:
    """The ILP over one graph and mesh: its size, and what decoding a solution needs."""

    mesh: MeshSpec
    units: str
    nodes: int  # ops and step inputs with a layout
    groups: int  # sets of nodes sharing one choice (an op and the ops following it)
    free_groups: int  # groups with more than one strategy: one-hot variables
    edges: int  # pairs of free groups with a resharding cost matrix
    variables: int
    integer_variables: int
    constraints: int
    memory_constraints: int
    nonzeros: int
    build_seconds: float
    data: Any = field(default=None, compare=False, repr=False)


class _Builder:
    """Groups, costs and liveness of the ILP; kept for decoding and re-pricing choices."""

    def __init__(self, graph: Graph, model: OpModel) -> None:
        self.graph = graph
        self.model = model
        self.nodes: list[_Node] = []
        self.sizes: list[int] = []  # strategies per group
        self.producer: dict[int, tuple[int, int]] = {}  # value -> (node, output index)
        for vid in graph.inputs:
            if model.tracked[vid]:
                layouts = model.input_layouts(vid)
                strategies = [OpStrategy(layout_name(d), (), (d,), 0.0) for d in layouts]
                group = self._new_group(len(strategies))
                self._add(
                    None, value=vid, group=group, strategies=strategies, inputs=(), outputs=(vid,)
                )
        for op in graph.ops:
            kind, leader = model.kind(op)
            if kind == "dot":
                strategies = list(model.dot_strategies(op))
                group = self._new_group(len(strategies))
            elif kind == "follow":
                node, index = self.producer[op.inputs[leader]]
                group = self.nodes[node].group
                strategies = [
                    model.follow(op, leader, s.outputs[index]) for s in self.nodes[node].strategies
                ]
            else:
                strategies = [model.replicated_strategy(op)]
                group = self._new_group(1)
            self._add(
                op.id,
                value=None,
                group=group,
                strategies=strategies,
                inputs=op.inputs,
                outputs=op.outputs,
            )
        self._costs()

    def _new_group(self, size: int) -> int:
        self.sizes.append(size)
        return len(self.sizes) - 1

    def _add(
        self,
        op: int | None,
        *,
        value: int | None,
        group: int,
        strategies: list[OpStrategy],
        inputs: tuple[int, ...],
        outputs: tuple[int, ...],
    ) -> None:
        self.nodes.append(_Node(op, value, group, strategies, inputs, outputs))
        for index, vid in enumerate(outputs):
            if self.model.tracked[vid]:
                self.producer[vid] = (len(self.nodes) - 1, index)

    def _matrix(self, vid: int, src: Sequence[DimAxes], dst: Sequence[DimAxes | None]) -> Any:
        """Resharding costs from each producer strategy's layout to each consumer want."""
        tt = self.graph.values[vid].type
        src_keys = {d: i for i, d in enumerate(dict.fromkeys(src))}
        dst_keys = {d: i for i, d in enumerate(dict.fromkeys(dst))}
        small = np.zeros((len(src_keys), len(dst_keys)))
        for s, i in src_keys.items():
            for d, j in dst_keys.items():
                small[i, j] = self.model.reshard(tt, s, d)
        rows = np.array([src_keys[d] for d in src])
        cols = np.array([dst_keys[d] for d in dst])
        return small[np.ix_(rows, cols)]

    def _costs(self) -> None:
        self.constant = 0.0
        self.node_cost = [np.zeros(k) for k in self.sizes]
        self.edges: dict[tuple[int, int], Any] = {}
        for node in self.nodes:
            costs = np.array([s.cost for s in node.strategies])
            self.node_cost[node.group] += costs
            for position, vid in enumerate(node.inputs):
                if vid not in self.producer:
                    continue
                wants = [s.operands[position] for s in node.strategies]
                if all(w is None for w in wants):
                    continue
                source, index = self.producer[vid]
                made = [s.outputs[index] for s in self.nodes[source].strategies]
                self._edge(vid, self.nodes[source].group, made, node.group, wants)
        # a result that updates a step input (new parameters, optimizer state) is stored in
        # that input's layout: the step's output sharding; other results leave replicated
        inputs = {
            (path_suffix(self.graph.values[v].path), self.graph.values[v].type.shape): v
            for v in self.graph.inputs
            if v in self.producer
        }
        paths = self.graph.output_paths or ("",) * len(self.graph.outputs)
        for vid, path in zip(self.graph.outputs, paths, strict=True):
            if vid not in self.producer:
                continue
            source, index = self.producer[vid]
            made = [s.outputs[index] for s in self.nodes[source].strategies]
            alias = inputs.get((path_suffix(path), self.graph.values[vid].type.shape))
            if alias is None:
                rank = self.graph.values[vid].type.rank
                self._edge(vid, self.nodes[source].group, made, None, [replicated(rank)])
            else:
                target = self.nodes[self.producer[alias][0]]
                stored: list[DimAxes | None] = [s.outputs[0] for s in target.strategies]
                self._edge(vid, self.nodes[source].group, made, target.group, stored)

    def _edge(
        self,
        vid: int,
        g: int,
        made: Sequence[DimAxes],
        h: int | None,
        wants: Sequence[DimAxes | None],
    ) -> None:
        matrix = self._matrix(vid, made, wants)
        if not matrix.any():
            return
        if h == g:  # same choice on both sides: only the diagonal is reachable
            self.node_cost[g] += np.diag(matrix)
        elif h is None or self.sizes[h] == 1:
            self.node_cost[g] += matrix[:, 0]
        elif self.sizes[g] == 1:
            self.node_cost[h] += matrix[0, :]
        else:
            key = (g, h)
            if key in self.edges:
                self.edges[key] = self.edges[key] + matrix
            else:
                self.edges[key] = matrix

    # -- memory -------------------------------------------------------------------------------

    def value_bytes(self, vid: int) -> Any:
        """Per-device bytes of `vid` under each strategy of its group."""
        node, index = self.producer[vid]
        tt = self.graph.values[vid].type
        return np.array(
            [
                int(self.model.local_bytes(tt, s.outputs[index]))
                for s in self.nodes[node].strategies
            ],
            dtype=np.int64,
        )

    def live_deltas(self) -> list[dict[int, Any]]:
        """At each program point whose live set is maximal, the per-device bytes by group
        that became live (positive) or died (negative) since the previous such point.

        Step inputs live throughout (a jitted step does not donate them); an op's result lives
        from the op to its last reader, or to the end for a step result. A point where nothing
        dies is dominated by the next one, and a point where nothing was born since the last
        point kept is dominated by that one: both are skipped. Differences rather than live
        sets keep the memory rows linear in the graph: each value enters two of them.
        """
        graph = self.graph
        results = set(graph.outputs)
        inputs = set(graph.inputs)
        last: dict[int, int] = {}  # op results: the last op reading them
        for op in graph.ops:
            for vid in op.inputs:
                if vid in self.producer and vid not in inputs and vid not in results:
                    last[vid] = op.id
        dying: dict[int, list[int]] = {}
        for vid, at in last.items():
            dying.setdefault(at, []).append(vid)
        pending: dict[int, Any] = {}

        def add(vid: int, sign: int) -> None:
            group = self.nodes[self.producer[vid][0]].group
            current = pending.get(group)
            delta = sign * self.value_bytes(vid)
            pending[group] = delta if current is None else current + delta

        for vid in graph.inputs:
            if vid in self.producer:
                add(vid, 1)
        points: list[dict[int, Any]] = []
        born = True
        for op in graph.ops:
            for vid in op.outputs:
                if vid in self.producer and (vid in last or vid in results):
                    add(vid, 1)
                    born = True
            if op.id in dying and born:
                points.append({g: v for g, v in pending.items() if v.any()})
                pending = {}
                born = False
            for vid in dying.get(op.id, ()):
                add(vid, -1)
        if born or not points:
            points.append({g: v for g, v in pending.items() if v.any()})
        return points

    def peak(self, choice: Sequence[int]) -> int:
        """Peak per-device bytes over every program point under `choice` (a strategy per
        group)."""
        best = live = 0
        for delta in self.live_deltas():
            live += int(sum(int(v[choice[g]]) for g, v in delta.items()))
            best = max(best, live)
        return best

    def objective(self, choice: Sequence[int]) -> float:
        total = self.constant + sum(float(c[choice[g]]) for g, c in enumerate(self.node_cost))
        for (g, h), matrix in self.edges.items():
            total += float(matrix[choice[g], choice[h]])
        return total


def _leanest_peak(builder: _Builder) -> int:
    """Peak under the leanest strategy of every group on its own (fewest bytes in all)."""
    total = [np.zeros(k, dtype=np.int64) for k in builder.sizes]
    for vid, (node, _) in builder.producer.items():
        total[builder.nodes[node].group] += builder.value_bytes(vid)
    return builder.peak([int(np.argmin(t)) for t in total])
