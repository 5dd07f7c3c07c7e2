"""The affine map of each primitive: from a JAX op's result to each of its operands, or None
where the analysis does not know the primitive."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from explorer.affine.expressions import AffineMap, Digit, DimExpr, _merge, _window

if TYPE_CHECKING:
    from explorer.ir import OpNode

ELEMENTWISE = frozenset(
    {
        "abs", "acos", "acosh", "add", "add_any", "and", "asin", "asinh", "atan", "atan2",
        "atanh", "cbrt", "ceil", "clamp", "convert_element_type", "copy", "copy_p", "cos",
        "cosh", "div", "eq", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "ge",
        "gt", "imag", "integer_pow", "is_finite", "le", "lgamma", "digamma", "log", "log1p",
        "logistic", "lt", "max", "min", "mul", "ne", "neg", "nextafter", "not", "or", "pow",
        "real", "reduce_precision", "rem", "round", "rsqrt", "select_n", "shift_left",
        "shift_right_arithmetic", "shift_right_logical", "sign", "sin", "sinh", "sqrt",
        "square", "stop_gradient", "sub", "tan", "tanh", "xor", "bitcast_convert_type",
        "population_count", "optimization_barrier",
    }
)  # fmt: skip

REDUCTIONS = frozenset(
    {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
     "argmax", "argmin", "reduce_xor"}
)  # fmt: skip

# Ops with no tensor operand the split could flow from: they start values, never carry one.
SOURCES = frozenset({"iota", "random_bits", "random_seed", "random_wrap", "rng_bit_generator"})

CUMULATIVE = frozenset({"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})


def identity(shape: tuple[int, ...]) -> AffineMap:
    return AffineMap(shape, shape, tuple(DimExpr.var(i, n) for i, n in enumerate(shape)))


def transpose(shape: tuple[int, ...], permutation: Sequence[int]) -> AffineMap:
    result = tuple(shape[p] for p in permutation)
    exprs = [DimExpr()] * len(shape)
    for out_dim, in_dim in enumerate(permutation):
        exprs[in_dim] = DimExpr.var(out_dim, shape[in_dim])
    return AffineMap(shape, result, tuple(exprs))


def broadcast(shape: tuple[int, ...], result: tuple[int, ...], dims: Sequence[int]) -> AffineMap:
    exprs = tuple(
        DimExpr.var(d, n) if n == result[d] else DimExpr() for n, d in zip(shape, dims, strict=True)
    )
    return AffineMap(shape, result, exprs)


def reduce(shape: tuple[int, ...], axes: Sequence[int]) -> AffineMap:
    exprs, out_dim = [], 0
    for i, n in enumerate(shape):
        if i in axes:
            exprs.append(DimExpr.star(n))
        else:
            exprs.append(DimExpr.var(out_dim, n))
            out_dim += 1
    result = tuple(n for i, n in enumerate(shape) if i not in axes)
    return AffineMap(shape, result, tuple(exprs))


def reshape(shape: tuple[int, ...], result: tuple[int, ...]) -> AffineMap:
    """Row-major reshape: each operand dim is a window of the result's linear index."""
    if math.prod(shape) != math.prod(result):
        raise ValueError(f"reshape {shape} -> {result} changes the size")
    # The result's linear index as a mixed-radix number whose digits are the result dims.
    linear = DimExpr(_merge([Digit(j, 1, n) for j, n in enumerate(result)]))
    exprs = []
    stride = math.prod(shape)
    for n in shape:
        stride //= n
        window = _window(linear, stride, n) if n > 1 else []
        if window is None:
            exprs.append(DimExpr.unknown(_dims_overlapping(result, stride, n)))
        else:
            exprs.append(DimExpr(_merge(window)))
    return AffineMap(shape, result, tuple(exprs))


def _dims_overlapping(result: tuple[int, ...], stride: int, size: int) -> list[int]:
    dims, place = [], 1
    for j in range(len(result) - 1, -1, -1):
        lo, hi = place, place * result[j]
        place = hi
        if lo < stride * size and hi > stride:
            dims.append(j)
    return dims


def dot_general(
    lhs: tuple[int, ...], rhs: tuple[int, ...], dimension_numbers: Any
) -> tuple[AffineMap, AffineMap]:
    (lc, rc), (lb, rb) = dimension_numbers
    lhs_free = [d for d in range(len(lhs)) if d not in lc and d not in lb]
    rhs_free = [d for d in range(len(rhs)) if d not in rc and d not in rb]
    result = (
        tuple(lhs[d] for d in lb)
        + tuple(lhs[d] for d in lhs_free)
        + tuple(rhs[d] for d in rhs_free)
    )
    lhs_exprs = [DimExpr()] * len(lhs)
    rhs_exprs = [DimExpr()] * len(rhs)
    for k, (l_dim, r_dim) in enumerate(zip(lb, rb, strict=True)):
        lhs_exprs[l_dim] = DimExpr.var(k, lhs[l_dim])
        rhs_exprs[r_dim] = DimExpr.var(k, rhs[r_dim])
    for l_dim, r_dim in zip(lc, rc, strict=True):
        lhs_exprs[l_dim] = DimExpr.star(lhs[l_dim])
        rhs_exprs[r_dim] = DimExpr.star(rhs[r_dim])
    offset = len(lb)
    for k, d in enumerate(lhs_free):
        lhs_exprs[d] = DimExpr.var(offset + k, lhs[d])
    offset += len(lhs_free)
    for k, d in enumerate(rhs_free):
        rhs_exprs[d] = DimExpr.var(offset + k, rhs[d])
    return (
        AffineMap(lhs, result, tuple(lhs_exprs)),
        AffineMap(rhs, result, tuple(rhs_exprs)),
    )


def conv_general_dilated(
    lhs: tuple[int, ...], rhs: tuple[int, ...], result: tuple[int, ...], params: dict[str, Any]
) -> tuple[AffineMap, AffineMap]:
    """Maps of a convolution's input (lhs) and kernel (rhs) from its result.

    `dimension_numbers` lists, per operand, its (batch, feature, spatial...) dims for the lhs
    and the result, and (output feature, input feature, spatial...) for the kernel. The batch
    and output-feature dims carry through; the contracted input features and the kernel's
    window are `*`. An input spatial dim reads a window around each output position: opaque,
    unless the window is a single unstrided, unpadded, undilated tap (a 1x1 conv).

    Feature groups (`feature_group_count` G) and batch groups (`batch_group_count` B, which
    JAX emits for the kernel gradient of a grouped conv) are group-major: output feature `o`
    belongs to group `o // (O/G)`, which reads input features `g*(C/G) ... (g+1)*(C/G) - 1`
    (likewise batch rows for batch groups). Each is one more digit of the output feature.
    """
    lhs_spec, rhs_spec, out_spec = params["dimension_numbers"]
    groups, batch_groups = params["feature_group_count"], params["batch_group_count"]
    out_batch, out_feature, out_spatial = out_spec[0], out_spec[1], out_spec[2:]
    features = result[out_feature]
    lhs_exprs = [DimExpr()] * len(lhs)
    rhs_exprs = [DimExpr()] * len(rhs)
    lhs_exprs[lhs_spec[0]] = _grouped(
        out_feature, features, batch_groups, Digit(out_batch, 1, lhs[lhs_spec[0]] // batch_groups)
    )
    lhs_exprs[lhs_spec[1]] = _grouped(
        out_feature, features, groups, Digit(None, 1, lhs[lhs_spec[1]] // groups)
    )
    rhs_exprs[rhs_spec[0]] = DimExpr.var(out_feature, rhs[rhs_spec[0]])
    rhs_exprs[rhs_spec[1]] = DimExpr.star(rhs[rhs_spec[1]])
    for k, (lhs_dim, rhs_dim, out_dim) in enumerate(
        zip(lhs_spec[2:], rhs_spec[2:], out_spatial, strict=True)
    ):
        rhs_exprs[rhs_dim] = DimExpr.star(rhs[rhs_dim])
        if _single_tap(params, k, rhs[rhs_dim]):
            lhs_exprs[lhs_dim] = DimExpr.var(out_dim, lhs[lhs_dim])
        else:
            lhs_exprs[lhs_dim] = DimExpr.unknown([out_dim])
    return (
        AffineMap(lhs, result, tuple(lhs_exprs)),
        AffineMap(rhs, result, tuple(rhs_exprs)),
    )


def _grouped(out_feature: int, features: int, groups: int, within: Digit) -> DimExpr:
    """`group * size(within) + within`, the group being the top digit of the output feature."""
    group = Digit(out_feature, features // groups, groups)
    return DimExpr(_merge([group, within]))


def _single_tap(params: dict[str, Any], spatial: int, window: int) -> bool:
    """Whether output position `i` of spatial dim `spatial` reads exactly input position `i`."""
    padding = params.get("padding") or ()
    lows_highs = padding[spatial] if spatial < len(padding) else (0, 0)

    def one(name: str) -> bool:
        values = params.get(name) or ()
        return spatial >= len(values) or values[spatial] == 1

    return (
        window == 1
        and tuple(lows_highs) == (0, 0)
        and one("window_strides")
        and one("lhs_dilation")
        and one("rhs_dilation")
    )


def _per_dim_unknown(
    shape: tuple[int, ...], result: tuple[int, ...], changed: set[int]
) -> AffineMap:
    """Same-rank op that keeps dims outside `changed` and scrambles the ones inside."""
    exprs = tuple(
        DimExpr.unknown([i]) if i in changed else DimExpr.var(i, n) for i, n in enumerate(shape)
    )
    return AffineMap(shape, result, exprs)


def _squeeze(shape: tuple[int, ...], dimensions: Sequence[int]) -> AffineMap:
    exprs, out_dim = [], 0
    for i, n in enumerate(shape):
        if i in dimensions:
            exprs.append(DimExpr())
        else:
            exprs.append(DimExpr.var(out_dim, n))
            out_dim += 1
    return AffineMap(
        shape, tuple(n for i, n in enumerate(shape) if i not in dimensions), tuple(exprs)
    )


def traced_op_maps(op: OpNode, result: int = 0) -> tuple[AffineMap | None, ...] | None:
    """`op_maps` of a traced op's `result`; None where the op is unknown or its parameters do
    not fit what the analysis expects of its primitive. Kept per signature (primitive,
    parameters, shapes): a deep step repeats each layer's ops, and its placement, blocks and
    per-op problems ask for the maps of each op many times."""
    signature = (
        op.primitive,
        op.params,
        tuple(t.shape for t in op.input_types),
        op.output_types[result].shape,
    )
    try:
        return _maps_or_none(*signature)
    except TypeError:  # a parameter that cannot be a key (a list, say): computed afresh
        return _maps_or_none.__wrapped__(*signature)


@functools.lru_cache(maxsize=1 << 16)
def _maps_or_none(
    primitive: str,
    params: tuple[tuple[str, Any], ...],
    operand_shapes: tuple[tuple[int, ...], ...],
    result_shape: tuple[int, ...],
) -> tuple[AffineMap | None, ...] | None:
    try:
        return op_maps(primitive, dict(params), operand_shapes, result_shape)
    except (KeyError, ValueError, TypeError, IndexError):
        return None


def op_maps(
    primitive: str,
    params: dict[str, Any],
    operand_shapes: Sequence[tuple[int, ...]],
    result_shape: tuple[int, ...],
) -> tuple[AffineMap | None, ...] | None:
    """Affine maps from the first result to each operand, or None if the primitive is unknown.

    A None entry means that operand has no index dependency we track (a scalar, or the index
    operand of a gather).
    """
    shapes = [tuple(s) for s in operand_shapes]
    if primitive in ELEMENTWISE:
        # lax broadcasts size-1 dims of same-rank operands implicitly: those dims are constant
        return tuple(
            broadcast(s, result_shape, range(len(s))) if len(s) == len(result_shape) and s else None
            for s in shapes
        )
    if primitive == "transpose":
        return (transpose(shapes[0], params["permutation"]),)
    if primitive == "broadcast_in_dim":
        return (broadcast(shapes[0], result_shape, params["broadcast_dimensions"]),) + (None,) * (
            len(shapes) - 1
        )
    if primitive == "reshape":
        return (reshape(shapes[0], result_shape),) + (None,) * (len(shapes) - 1)
    if primitive == "squeeze":
        return (_squeeze(shapes[0], params["dimensions"]),)
    if primitive == "expand_dims":
        return (reshape(shapes[0], result_shape),)
    if primitive in REDUCTIONS:
        return (reduce(shapes[0], params["axes"]),)
    if primitive == "dot_general":
        return dot_general(shapes[0], shapes[1], params["dimension_numbers"])
    if primitive == "conv_general_dilated":
        return conv_general_dilated(shapes[0], shapes[1], result_shape, params)
    if primitive == "split":
        return (_per_dim_unknown(shapes[0], result_shape, {params["axis"]}),)
    if primitive in CUMULATIVE:
        return (_per_dim_unknown(shapes[0], result_shape, {params["axis"]}),)
    if primitive in ("slice", "pad", "rev", "dynamic_slice", "dynamic_update_slice"):
        source = shapes[0]
        changed = {i for i, n in enumerate(source) if n != result_shape[i]}
        if primitive == "rev":
            changed = set(params["dimensions"])
        if primitive == "slice" and params.get("strides"):
            changed |= {i for i, s in enumerate(params["strides"]) if s not in (None, 1)}
        first = _per_dim_unknown(source, result_shape, changed)
        rest: tuple[AffineMap | None, ...] = ()
        if primitive == "dynamic_update_slice":
            update = shapes[1]
            rest = (_per_dim_unknown(update, result_shape, set(range(len(update)))),)
        return (first, *rest) + (None,) * (len(shapes) - 1 - len(rest))
    if primitive == "concatenate":
        dim = params["dimension"]
        return tuple(_per_dim_unknown(s, result_shape, {dim}) for s in shapes)
    if primitive in ("sort", "top_k"):
        last = len(shapes[0]) - 1
        dim = params.get("dimension", last)
        return tuple(
            _per_dim_unknown(s, result_shape, {dim}) if len(s) == len(result_shape) else None
            for s in shapes
        )
    if primitive in SOURCES:
        return (None,) * len(shapes)
    if primitive == "gather":
        return _gather(shapes, result_shape, params)
    return None


def _gather(
    shapes: list[tuple[int, ...]], result: tuple[int, ...], params: dict[str, Any]
) -> tuple[AffineMap | None, ...] | None:
    """Operand dims gathered whole follow the result's offset dims; the rest are opaque."""
    numbers = params.get("dimension_numbers")
    slice_sizes = params.get("slice_sizes")
    if numbers is None or slice_sizes is None:
        return None
    try:
        offset_dims, collapsed, start_index_map = numbers[0], numbers[1], numbers[2]
    except (TypeError, IndexError):
        return None
    operand = shapes[0]
    kept = [d for d in range(len(operand)) if d not in collapsed]
    batching = set(numbers[3]) if len(numbers) > 3 and numbers[3] else set()
    kept = [d for d in kept if d not in batching]
    if len(kept) != len(offset_dims):
        return None
    exprs = [DimExpr.unknown(range(len(result)))] * len(operand)
    for d, out_dim in zip(kept, offset_dims, strict=True):
        whole = slice_sizes[d] == operand[d] and d not in start_index_map
        exprs[d] = DimExpr.var(out_dim, operand[d]) if whole else DimExpr.unknown([out_dim])
    operand_map = AffineMap(operand, result, tuple(exprs))
    # indices: their leading dims are the result's non-offset dims, in order
    indices = shapes[1]
    batch_out = [j for j in range(len(result)) if j not in offset_dims]
    idx_exprs = []
    for k, n in enumerate(indices):
        if k < len(batch_out) and k < len(indices) - 1 and n == result[batch_out[k]]:
            idx_exprs.append(DimExpr.var(batch_out[k], n))
        else:
            idx_exprs.append(DimExpr() if n == 1 else DimExpr.unknown(batch_out))
    return (operand_map, AffineMap(indices, result, tuple(idx_exprs)))
