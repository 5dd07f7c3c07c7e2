"""Tracing the model zoo: backward links, roles and linear growth with depth."""

from __future__ import annotations

import pytest
from helpers import MODEL_NAMES, traced

from explorer.ir import Role, ValueKind


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_backward_dot_links_to_a_forward_dot(name: str) -> None:
    _, _, graph = traced(name)
    backward_dots = [op for op in graph.contractions() if op.role is Role.BACKWARD]
    assert backward_dots
    for op in backward_dots:
        assert op.forward_op is not None, f"{name}: {op} has no forward op"
        forward = graph.ops[op.forward_op]
        assert forward.primitive == "dot_general" and forward.role is Role.FORWARD
        assert forward.scope == op.scope


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_roles_partition_the_ops_and_inputs_are_classified(name: str) -> None:
    _, _, graph = traced(name)
    counts = graph.role_counts()
    assert sum(counts.values()) == len(graph.ops)
    assert all(counts[role] > 0 for role in Role)
    kinds = {graph.values[v].kind for v in graph.inputs}
    assert kinds == {ValueKind.PARAMETER, ValueKind.OPTIMIZER_STATE, ValueKind.DATA, ValueKind.RNG}
    # AdamW keeps two moments per parameter plus a step count
    params = len(graph.inputs_of_kind(ValueKind.PARAMETER))
    assert len(graph.inputs_of_kind(ValueKind.OPTIMIZER_STATE)) == 2 * params + 1


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_op_count_grows_linearly_with_layers(name: str) -> None:
    counts = [len(traced(name, layers)[2].ops) for layers in (2, 4, 8)]
    per_two_layers = counts[1] - counts[0]
    assert per_two_layers > 0
    assert counts[2] - counts[1] == 2 * per_two_layers, counts
