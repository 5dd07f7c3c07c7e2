"""Affine dependency maps: composition agrees with brute-force index mapping (Eq. 2 too)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from explorer import affine
from explorer.affine import AffineMap


def _brute_force(shape: tuple[int, ...], chain: list[tuple[str, Any]]) -> np.ndarray:
    """Simulate the chain on sets of source flat indices."""
    array = np.empty(math.prod(shape), dtype=object)
    for i in range(array.size):
        array[i] = frozenset({i})
    array = array.reshape(shape)
    union = np.frompyfunc(lambda a, b: a | b, 2, 1)
    for kind, arg in chain:
        if kind == "transpose":
            array = np.transpose(array, arg)
        elif kind == "reshape":
            array = array.reshape(arg)
        elif kind == "broadcast":
            result, dims = arg
            expanded = array.reshape([result[d] if d in dims else 1 for d in range(len(result))])
            array = np.broadcast_to(expanded, result)
        elif kind == "reduce":
            array = union.reduce(array, axis=arg)
            if not isinstance(array, np.ndarray):
                array = np.array(array, dtype=object)
    return array


@st.composite
def chains(draw: Any) -> tuple[tuple[int, ...], list[tuple[str, Any]], AffineMap]:
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=3)))
    start = shape
    chain: list[tuple[str, Any]] = []
    composed: AffineMap | None = None
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["transpose", "split", "merge", "broadcast", "reduce"]))
        if kind == "transpose":
            perm = tuple(draw(st.permutations(range(len(shape)))))
            step_map = affine.transpose(shape, perm)
            chain.append(("transpose", perm))
        elif kind == "split":
            dim = draw(st.integers(0, len(shape) - 1))
            n = shape[dim]
            factors = [k for k in range(2, n) if n % k == 0]
            if not factors:
                continue
            k = draw(st.sampled_from(factors))
            result = (*shape[:dim], n // k, k, *shape[dim + 1 :])
            step_map = affine.reshape(shape, result)
            chain.append(("reshape", result))
        elif kind == "merge":
            if len(shape) < 2:
                continue
            dim = draw(st.integers(0, len(shape) - 2))
            result = (*shape[:dim], shape[dim] * shape[dim + 1], *shape[dim + 2 :])
            step_map = affine.reshape(shape, result)
            chain.append(("reshape", result))
        elif kind == "broadcast":
            if len(shape) >= 4 or math.prod(shape) > 48:
                continue
            position = draw(st.integers(0, len(shape)))
            size = draw(st.sampled_from([2, 3]))
            result = (*shape[:position], size, *shape[position:])
            dims = tuple(d if d < position else d + 1 for d in range(len(shape)))
            step_map = affine.broadcast(shape, result, dims)
            chain.append(("broadcast", (result, dims)))
        else:
            if len(shape) < 2:
                continue
            axis = draw(st.integers(0, len(shape) - 1))
            step_map = affine.reduce(shape, (axis,))
            chain.append(("reduce", axis))
        composed = step_map if composed is None else composed.compose(step_map)
        shape = step_map.result_shape
    if composed is None:
        composed = affine.identity(shape)
    return start, chain, composed


@settings(max_examples=150, deadline=None)
@given(chains())
def test_composed_maps_agree_with_brute_force(case: Any) -> None:
    _check_against_brute_force(*case)


def test_a_misaligned_split_after_a_transpose_stays_sound() -> None:
    """Found by hypothesis: (2,3) merged then split as (3,2) cannot be exact."""
    start = (1, 3, 2)
    chain: list[tuple[str, Any]] = [
        ("reshape", (3, 2)), ("transpose", (1, 0)), ("reshape", (6,)), ("reshape", (3, 2)),
    ]  # fmt: skip
    composed = (
        affine.reshape(start, (3, 2))
        .compose(affine.transpose((3, 2), (1, 0)))
        .compose(affine.reshape((2, 3), (6,)))
        .compose(affine.reshape((6,), (3, 2)))
    )
    assert composed.exprs[1].opaque
    _check_against_brute_force(start, chain, composed)


def _check_against_brute_force(
    start: tuple[int, ...], chain: list[tuple[str, Any]], composed: AffineMap
) -> None:
    """Exact dims reproduce the brute-force reads; opaque dims name every dim they read."""
    expected = _brute_force(start, chain)
    assert tuple(expected.shape) == composed.result_shape
    indices = list(itertools.product(*(range(n) for n in composed.result_shape)))
    exact = [i for i, e in enumerate(composed.exprs) if not e.opaque]
    for index in indices:
        truth = [np.unravel_index(f, start) for f in expected[index]]
        found = composed.evaluate(index)
        for dim in exact:
            assert {int(t[dim]) for t in truth} == {int(a[dim]) for a in found}, (index, dim)
        assert len(found) >= len(truth)
    for dim, expr in enumerate(composed.exprs):
        if not expr.opaque:
            continue
        # soundness: result elements that agree on the dims read see the same operand coords
        seen: dict[tuple[int, ...], set[int]] = {}
        for index in indices:
            key = tuple(index[d] for d in expr.reads)
            coords = {int(np.unravel_index(f, start)[dim]) for f in expected[index]}
            assert seen.setdefault(key, coords) == coords, (dim, expr.reads)


@settings(max_examples=150, deadline=None)
@given(chains(), st.sampled_from([2, 3, 4]))
def test_split_target_is_an_even_block_split(case: Any, parts: int) -> None:
    """Eq. 2: when a P-way split of operand dim i maps to result dim j, blocks line up."""
    start, _, composed = case
    for dim in range(len(start)):
        target = composed.split_target(dim, parts)
        if target is None:
            continue
        in_block = start[dim] // parts
        out_block = composed.result_shape[target] // parts
        for index in itertools.product(*(range(n) for n in composed.result_shape)):
            for operand_index in composed.evaluate(index):
                assert operand_index[dim] // in_block == index[target] // out_block


def test_misaligned_reshape_is_opaque_and_keeps_its_reads() -> None:
    through = affine.reshape((2, 3), (6,)).compose(affine.reshape((6,), (3, 2)))
    assert through.exprs[0].opaque
    assert through.exprs[0].result_dims() == (0, 1)
    assert through.split_target(0, 2) is None


def test_fused_qkv_split_keeps_heads_local() -> None:
    """[B,S,3H] -> [B,S,heads,3,D]: a column split is a split of heads (Megatron layout)."""
    qkv = affine.reshape((8, 32, 192), (8, 32, 8, 3, 8))
    assert qkv.split_target(2, 4) == 2
    assert qkv.split_target(0, 4) == 0
    # [B,S,3,heads,D] would not: a 4-way split of 3*64 straddles q, k and v
    assert affine.reshape((8, 32, 192), (8, 32, 3, 8, 8)).split_target(2, 4) is None


def test_contraction_dim_is_a_reduction() -> None:
    lhs, rhs = affine.dot_general((8, 64), (64, 32), (((1,), (0,)), ((), ())))
    assert lhs.split_target(0, 4) == 0  # rows follow the result
    assert lhs.split_target(1, 4) is None  # K leaves partial sums
    assert rhs.split_target(1, 4) == 1  # columns follow the result


def test_unknown_primitive_has_no_maps() -> None:
    assert affine.op_maps("my_custom_op", {}, [(4,)], (4,)) is None
