"""Dot and convolution FLOPs per dtype, read from optimised HLO text (explorer.profile.compute)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import NamedSharding, PartitionSpec

from explorer.errors import HloComputeError
from explorer.models import GPTConfig, gpt
from explorer.profile.backends import FAST_COMPILE
from explorer.profile.compute import DOT_DTYPES, dot_flops


def _compile(fn: Callable[..., Any], *args: Any) -> Any:
    # The way the compiled backend compiles (and what jax 0.10 on CPU really emits).
    options: dict[str, Any] = dict(FAST_COMPILE)
    return jax.jit(fn).lower(*args).compile(compiler_options=options)


def _flops(compiled: Any) -> float:
    return float(compiled.cost_analysis()["flops"])


def _ones(shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    return jnp.ones(shape, dtype)


def _matmul_as(dtype: Any) -> Callable[[jax.Array, jax.Array], jax.Array]:
    return lambda a, b: a.astype(dtype) @ b.astype(dtype)


def _dot_to_f32(a: jax.Array, b: jax.Array) -> jax.Array:
    return jax.lax.dot(a, b, preferred_element_type=jnp.float32)


def _dot_to_s32(a: jax.Array, b: jax.Array) -> jax.Array:
    return jax.lax.dot(a, b, preferred_element_type=jnp.int32)


M, K, N = 16, 32, 24


def _operands(lhs: Any = jnp.float32, rhs: Any = None) -> tuple[jax.Array, jax.Array]:
    return _ones((M, K), lhs), _ones((K, N), lhs if rhs is None else rhs)


MATMULS = [
    ("f32", jnp.matmul, _operands(), "f32"),
    ("f32-tanh", lambda a, b: jnp.tanh(a @ b), _operands(), "f32"),
    ("bf16-params", jnp.matmul, _operands(jnp.bfloat16), "bf16"),
    ("bf16-cast-in-step", _matmul_as(jnp.bfloat16), _operands(), "bf16"),
    ("bf16-to-f32", _dot_to_f32, _operands(jnp.bfloat16), "bf16"),
    ("f16", jnp.matmul, _operands(jnp.float16), "f16"),
    ("f8", _dot_to_f32, _operands(jnp.float8_e4m3fn), "f8e4m3fn"),
    ("s8", _dot_to_s32, _operands(jnp.int8), "s8"),
    # The program's own upcast is kept: this dot is an f32 dot wherever it runs.
    ("explicit-upcast", _matmul_as(jnp.float32), _operands(jnp.bfloat16), "f32"),
    ("mixed", lambda a, b: a @ b.astype(jnp.float32), _operands(jnp.float32, jnp.bfloat16), "f32"),
]


@pytest.mark.parametrize(
    ("fn", "args", "dtype"), [m[1:] for m in MATMULS], ids=[m[0] for m in MATMULS]
)
def test_matmul_flops_and_dtype(fn: Callable[..., Any], args: tuple[Any, ...], dtype: str) -> None:
    compiled = _compile(fn, *args)
    assert dot_flops(compiled.as_text()) == ((dtype, 2.0 * M * N * K),)
    # dot FLOPs are part of the cost analysis's total, the rest is elementwise work
    assert _flops(compiled) >= 2.0 * M * N * K


def test_pure_matmul_matches_cost_analysis() -> None:
    compiled = _compile(jnp.matmul, *_operands())
    assert dot_flops(compiled.as_text()) == (("f32", _flops(compiled)),)


@pytest.mark.parametrize(("dtype", "name"), [(jnp.float32, "f32"), (jnp.bfloat16, "bf16")])
def test_batched_einsums(dtype: Any, name: str) -> None:
    b, s, h, d = 2, 16, 4, 8
    q = _ones((b, s, h, d), dtype)

    def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
        return jnp.einsum("bhqk,bkhd->bqhd", scores, v)

    compiled = _compile(attention, q, q, q)
    expected = 2 * (2.0 * b * h * s * s * d)  # two einsums of b*h*s*s outputs, d deep
    assert dot_flops(compiled.as_text()) == ((name, expected),)


def test_sharded_matmul_counts_one_device() -> None:
    mesh = jax.make_mesh((4, 2), ("x", "y"))
    a = jax.device_put(_ones((64, K)), NamedSharding(mesh, PartitionSpec("x", None)))
    b = jax.device_put(_ones((K, 48)), NamedSharding(mesh, PartitionSpec(None, "y")))
    compiled = _compile(lambda a, b: jnp.tanh(a @ b), a, b)
    # each device multiplies a 16 x 32 block by a 32 x 24 one
    assert dot_flops(compiled.as_text()) == (("f32", 2.0 * 16 * 24 * K),)


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [
        (None, "f32"),
        ("default", "f32"),
        ("highest", "f32"),
        ("F32_F32_F32", "f32"),
        ("high", "tf32"),  # what jax.default_matmul_precision("tensorfloat32") gives
        ("BF16_BF16_F32", "bf16"),
        ("BF16_BF16_F32_X3", "f32"),  # multi-pass emulation of f32 counts as f32
    ],
)
def test_f32_dots_that_ask_for_less_precision(precision: str | None, dtype: str) -> None:
    compiled = _compile(lambda a, b: jnp.dot(a, b, precision=precision), *_operands())
    assert dot_flops(compiled.as_text()) == ((dtype, 2.0 * M * N * K),)


def test_default_matmul_precision_tensorfloat32_is_tf32() -> None:
    with jax.default_matmul_precision("tensorfloat32"):
        compiled = _compile(jnp.matmul, *_operands())
    assert dot_flops(compiled.as_text()) == (("tf32", 2.0 * M * N * K),)


def _conv(
    strides: tuple[int, int] = (1, 1),
    padding: Any = "SAME",
    lhs_dilation: tuple[int, int] | None = None,
    rhs_dilation: tuple[int, int] | None = None,
    groups: int = 1,
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    def conv(x: jax.Array, w: jax.Array) -> jax.Array:
        return jax.lax.conv_general_dilated(
            x,
            w,
            strides,
            padding,
            lhs_dilation=lhs_dilation,
            rhs_dilation=rhs_dilation,
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=groups,
        )

    return conv


X, W = _ones((4, 9, 16, 16)), _ones((3, 3, 16, 32))
CONVS = [
    ("same", _conv(), X, W),
    ("valid", _conv(padding="VALID"), X, W),
    ("stride-2", _conv(strides=(2, 2)), X, W),
    ("transposed", _conv(lhs_dilation=(2, 2), padding=((1, 2), (0, 1))), X, W),
    ("atrous", _conv(rhs_dilation=(2, 2)), X, W),
    ("grouped", _conv(groups=4), X, _ones((3, 3, 4, 32))),
    ("1d-nch", lambda x, w: jax.lax.conv(x, w, (1,), "SAME"), _ones((2, 8, 20)), _ones((6, 8, 5))),
    ("backward", jax.grad(lambda x, w: _conv()(x, w).sum(), argnums=(0, 1)), X, W),
]  # fmt: skip


@pytest.mark.parametrize(("fn", "x", "w"), [c[1:] for c in CONVS], ids=[c[0] for c in CONVS])
def test_convolution_matches_cost_analysis(fn: Callable[..., Any], x: Any, w: Any) -> None:
    compiled = _compile(fn, x, w)
    assert dot_flops(compiled.as_text()) == (("f32", _flops(compiled)),)


def test_valid_convolution_is_the_textbook_count() -> None:
    compiled = _compile(_conv(padding="VALID"), X, W)
    out = 4 * 7 * 14 * 32  # batch * output rows * output columns * output features
    assert dot_flops(compiled.as_text()) == (("f32", 2.0 * out * 16 * 3 * 3),)


def test_bf16_convolution_is_bf16() -> None:
    compiled = _compile(_conv(), X.astype(jnp.bfloat16), W.astype(jnp.bfloat16))
    (dtype, flops), *_ = dot_flops(compiled.as_text())
    assert dtype == "bf16" and flops == _flops(_compile(_conv(), X, W))


def test_tiny_gpt_step_in_bf16_multiplies_in_bf16() -> None:
    counts = {}
    for config in (GPTConfig.tiny(), GPTConfig.tiny_bf16()):
        step, args = gpt(config, abstract=True)
        compiled = _compile(step, *args)
        counts[config.dtype] = dot_flops(compiled.as_text())
        assert sum(f for _, f in counts[config.dtype]) < _flops(compiled)
    (f32, flops), *rest = counts["float32"]
    assert f32 == "f32" and not rest
    assert counts["bfloat16"] == (("bf16", flops),)


# ---------------------------------------------------------------------------------------------
# Hand-written HLO: the spellings jax 0.10 on CPU does not print, and the errors


def _dot_module(batch: tuple[int, ...], m: int, k: int, n: int, *, shapes: bool) -> str:
    dims = ",".join(str(d) for d in batch)
    pre = f"{dims}," if batch else ""
    lhs, rhs, out = f"f32[{pre}{m},{k}]", f"f32[{pre}{k},{n}]", f"f32[{pre}{m},{n}]"
    nb = len(batch)
    batch_dims = ",".join(str(i) for i in range(nb))
    operands = f"{lhs}{{1,0}} %p0, {rhs}{{1,0}} %p1" if shapes else "%p0, %p1"
    attrs = f"lhs_contracting_dims={{{nb + 1}}}, rhs_contracting_dims={{{nb}}}"
    if batch:
        attrs = f"lhs_batch_dims={{{batch_dims}}}, rhs_batch_dims={{{batch_dims}}}, " + attrs
    return f"""HloModule m, entry_computation_layout={{({lhs}, {rhs})->{out}}}

ENTRY %main (p0: {lhs}, p1: {rhs}) -> {out} {{
  %p0 = {lhs}{{1,0}} parameter(0)
  %p1 = {rhs}{{1,0}} parameter(1)
  ROOT %dot.3 = {out}{{1,0}} dot({operands}), {attrs}, metadata={{op_name="jit(f)/dot_general"}}
}}
"""


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.integers(1, 6), max_size=2).map(tuple),
    st.integers(1, 64),
    st.integers(1, 64),
    st.integers(1, 64),
)
def test_dot_text_with_and_without_operand_shapes(
    batch: tuple[int, ...], m: int, k: int, n: int
) -> None:
    expected = (("f32", 2.0 * math.prod(batch) * m * k * n),)
    assert dot_flops(_dot_module(batch, m, k, n, shapes=True)) == expected
    assert dot_flops(_dot_module(batch, m, k, n, shapes=False)) == expected


CUBLAS = """HloModule gpu

ENTRY %main (p0: bf16[16,32], p1: bf16[32,8]) -> bf16[16,8] {
  %p0 = bf16[16,32]{1,0} parameter(0)
  %p1 = bf16[32,8]{1,0} parameter(1)
  %gemm = (bf16[16,8]{1,0}, s8[1028]{0}) custom-call(%p0, %p1), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/dot_general"}, backend_config={"operation_queue_id":"0","gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"precision_config":{"operand_precision":["DEFAULT","DEFAULT"],"algorithm":"ALG_UNSET"},"epilogue":"DEFAULT"}}
  ROOT %gte = bf16[16,8]{1,0} get-tuple-element(%gemm), index=0
}
"""  # noqa: E501


def test_cublas_custom_call_counts_as_a_dot() -> None:
    assert dot_flops(CUBLAS) == (("bf16", 2.0 * 16 * 8 * 32),)
    tf32 = CUBLAS.replace("bf16[", "f32[").replace('"DEFAULT","DEFAULT"', '"HIGH","HIGH"')
    assert dot_flops(tf32) == (("tf32", 2.0 * 16 * 8 * 32),)


def test_unknown_matrix_custom_call_is_an_error() -> None:
    text = CUBLAS.replace("__cublas$gemm", "__onednn$matmul")
    with pytest.raises(HloComputeError, match=r"%gemm targets '__onednn\$matmul'"):
        dot_flops(text)
    # other custom-calls are not matrix work
    assert dot_flops(CUBLAS.replace("__cublas$gemm", "Sharding")) == ()


def test_operand_without_shape_or_definition_is_an_error() -> None:
    text = _dot_module((), 4, 4, 4, shapes=False).replace("%p1 = ", "%other = ")
    with pytest.raises(HloComputeError, match=r"operand %p1 is printed without a shape"):
        dot_flops(text)


def test_dtype_names_are_the_platform_vocabulary() -> None:
    assert {"f32", "tf32", "bf16", "f16", "f8e4m3fn", "f8e5m2", "s8"} <= set(DOT_DTYPES)
    assert len(set(DOT_DTYPES)) == len(DOT_DTYPES)
