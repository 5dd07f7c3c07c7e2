"""FLOPs of the matrix units, per dtype, read from the optimised HLO of a compiled program.

Matrix multiplies (dot, convolution) run on units whose peak depends on the dtype they multiply
in: an A100 does 19.5 TFLOP/s in f32 and 312 in bf16. `dot_flops` counts the FLOPs of every
dot and convolution of a module, grouped by that dtype, so that `Platform.compute_time` can
price each group at its own peak.

The dtype a dot multiplies in is the dtype of its lhs operand as HLO spells it ("f32", "bf16",
"f8e4m3fn", "s8"; the wider operand when they differ), with two refinements:

- Converts the *compiler* inserted are looked through. XLA:CPU has no bf16/f16/f8 matmul
  kernels and rewrites `dot(bf16, bf16)` as `dot(convert(bf16 -> f32), ...)`; the program
  asked for bf16, which is what a GPU runs. A widening convert counts as inserted when it
  carries no JAX op name of its own (none, or the dot's); one the program wrote
  (`x.astype(jnp.float32)`, named `.../convert_element_type`) is kept.
- An f32 dot that asks for less precision multiplies in what it asks for:
  `operand_precision={high,high}` (JAX's "tensorfloat32" precision) and
  `algorithm=dot_tf32_tf32_f32` in tf32, `algorithm=dot_bf16_bf16_f32` in bf16. Default and
  full precision, and the multi-pass algorithms that emulate f32 (`..._x3`), count as f32
  (`Platform.compute_time` explains why).

FLOPs follow XLA's own cost analysis (`HloCostAnalysis`), so that the dot FLOPs plus the
elementwise FLOPs add up to `compiled.cost_analysis()["flops"]`: a dot is
2 * result elements * contracted size; a convolution is 2 * (input features / feature groups)
* output features * (batch / batch groups) * the (output, kernel) position pairs that land
inside the input in each spatial dimension, so taps on padding are not counted.

Dots appear at the top level, inside fused computations (XLA:CPU wraps them in `__ynn_fusion`
fusions) and, on GPU, as cuBLAS custom-calls; each is counted once per occurrence in the text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from explorer.errors import HloComputeError
from explorer.profile.hlo_reader import (
    _Computation,
    _Instruction,
    _Operand,
    _read_computations,
)

# Every name `dot_flops` can group FLOPs under: the dtypes HLO gives dot operands, plus "tf32"
# (f32 dots at TensorFloat-32 precision). A platform gives a peak for the ones its device has.
DOT_DTYPES = (
    "f64", "f32", "tf32", "bf16", "f16",
    "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e3m4", "f8e4m3fnuz", "f8e5m2fnuz", "f8e4m3b11fnuz",
    "f4e2m1fn",
    "s64", "s32", "s16", "s8", "s4", "u64", "u32", "u16", "u8", "u4",
    "c64", "c128",
)  # fmt: skip

# Ops that move or reshape data without changing its dtype: a compiler-inserted convert may
# sit behind them (convert, then transpose into the dot's layout).
_MOVES = frozenset(
    {"bitcast", "copy", "transpose", "reshape", "broadcast", "slice", "dynamic-slice", "reverse"}
)
_CUBLAS_TARGETS = ("__cublas$gemm", "__cublas$lt$matmul", "__cublas$lt$matmul$f8")
# Custom-calls whose names say they multiply matrices: counting them as zero would silently
# price a program's main work as free, so they are an error instead.
_MATMUL_LIKE = ("matmul", "gemm", "conv", "fmha")
_MAX_WALK = 64  # steps when looking through converts; HLO chains are a handful long

# the text by which a line may be an instruction `_Module.count` counts (its opcode, called)
_COUNTED = (" dot(", " convolution(", " custom-call(")
_CALLS = re.compile(r"\b(?:calls|to_apply)=%?(?P<name>[\w.\-]+)")
_DIM_LABELS = re.compile(r"dim_labels=(?P<lhs>[0-9a-z]+)_(?P<rhs>[0-9a-z]+)->(?P<out>[0-9a-z]+)")
_WINDOW = re.compile(r"window=\{(?P<body>[^}]*)\}")
_LHS_CONTRACTING = re.compile(r"lhs_contracting_dims=\{(?P<dims>[\d,]*)\}")
_PRECISION = re.compile(r"operand_precision=\{(?P<lhs>\w+),(?P<rhs>\w+)\}")
_ALGORITHM = re.compile(r"algorithm=(?:dot_)?(?P<name>\w+)")
_TARGET = re.compile(r'custom_call_target="(?P<target>[^"]*)"')
_BACKEND_CONFIG = re.compile(r"backend_config=(?P<json>\{.*\})\s*$")


def dot_flops(hlo_text: str) -> tuple[tuple[str, float], ...]:
    """FLOPs of every dot and convolution of an optimised HLO module, per multiply dtype.

    `hlo_text` is what `compiled.as_text()` returns for a JAX `Compiled`. Returns
    `((dtype, flops), ...)` sorted by dtype name, dtypes as HLO spells them plus "tf32" (see
    the module doc for which dtype a dot multiplies in); dtypes without dots are left out.
    """
    module = _Module.parse(hlo_text)
    totals: dict[str, float] = {}
    for computation in module.computations.values():
        for instr in computation.instructions.with_text(*_COUNTED):
            counted = module.count(computation, instr)
            if counted is not None:
                dtype, flops = counted
                totals[dtype] = totals.get(dtype, 0.0) + flops
    return tuple(sorted((d, f) for d, f in totals.items() if f > 0))


@dataclass(frozen=True, slots=True)
class _Module:
    computations: dict[str, _Computation]
    # computation -> (computation, instruction) that calls it; fusions are called once
    callers: dict[str, tuple[str, _Instruction]]

    @classmethod
    def parse(cls, text: str) -> _Module:
        computations = _read_computations(text)
        callers: dict[str, tuple[str, _Instruction]] = {}
        for computation in computations.values():
            for instr in computation.instructions.with_text("calls=", "to_apply="):
                called = instr.attr(_CALLS)
                if called and instr.opcode in ("fusion", "call"):
                    callers.setdefault(called["name"], (computation.name, instr))
        return cls(computations, callers)

    def count(self, computation: _Computation, instr: _Instruction) -> tuple[str, float] | None:
        """(dtype, FLOPs) of a dot, convolution or cuBLAS call; None for any other op."""
        if instr.opcode == "dot":
            contracting = _ints(instr.attr(_LHS_CONTRACTING))
            return self._dot(computation, instr, contracting, _precision_of(instr.attrs))
        if instr.opcode == "convolution":
            return self._convolution(computation, instr)
        if instr.opcode == "custom-call":
            return self._custom_call(computation, instr)
        return None

    def _dot(
        self,
        computation: _Computation,
        instr: _Instruction,
        contracting: tuple[int, ...],
        precision: str | None,
    ) -> tuple[str, float]:
        lhs_dims = self.dims_of(computation, instr.operands[0], instr)
        contracted = math.prod(lhs_dims[i] for i in contracting)
        flops = 2.0 * math.prod(instr.dims) * contracted
        return self._multiply_dtype(computation, instr, precision, flops)

    def _convolution(self, computation: _Computation, instr: _Instruction) -> tuple[str, float]:
        lhs = self.dims_of(computation, instr.operands[0], instr)
        rhs = self.dims_of(computation, instr.operands[1], instr)
        flops = _convolution_flops(instr, lhs, rhs)
        return self._multiply_dtype(computation, instr, _precision_of(instr.attrs), flops)

    def _custom_call(
        self, computation: _Computation, instr: _Instruction
    ) -> tuple[str, float] | None:
        found = instr.attr(_TARGET)
        target = found["target"] if found else ""
        if target in _CUBLAS_TARGETS:
            config = _cublas_config(instr)
            dims = config.get("dot_dimension_numbers", {})
            contracting = tuple(int(d) for d in dims.get("lhs_contracting_dimensions", ()))
            precision = config.get("precision_config", {})
            operands = [str(p).lower() for p in precision.get("operand_precision", ())]
            algorithm = str(precision.get("algorithm", "")).lower()  # e.g. ALG_DOT_BF16_BF16_F32
            algorithm = algorithm.removeprefix("alg_").removeprefix("dot_")
            return self._dot(computation, instr, contracting, _asked_dtype(operands, algorithm))
        if any(word in target.lower() for word in _MATMUL_LIKE):
            raise HloComputeError(
                f"custom-call %{instr.name} targets {target!r}, a matrix kernel whose FLOPs "
                "dot_flops cannot read from the HLO text (it counts dot, convolution and "
                f"{list(_CUBLAS_TARGETS)}); compile for the CPU backend, which keeps dots as "
                "dots, or teach explorer/profile/compute.py this target"
            )
        return None

    def _multiply_dtype(
        self,
        computation: _Computation,
        instr: _Instruction,
        asked: str | None,
        flops: float,
    ) -> tuple[str, float]:
        lhs, rhs = (self.source_dtype(computation, op, instr) for op in instr.operands[:2])
        dtype = rhs if _bits(rhs) > _bits(lhs) else lhs  # the wider operand sets the pace
        if dtype == "f32" and asked is not None:
            dtype = asked
        return dtype, flops

    def dims_of(
        self, computation: _Computation, operand: _Operand, user: _Instruction
    ) -> tuple[int, ...]:
        if operand.dims is not None:
            return operand.dims
        return _defined(computation, operand, user).dims

    def source_dtype(self, computation: _Computation, operand: _Operand, user: _Instruction) -> str:
        """The dtype an operand had before converts the compiler inserted (module doc)."""
        dtype = operand.dtype or _defined(computation, operand, user).dtype
        for comp, instr in self._walk_up(computation, operand.name, user.op_name):
            if instr.opcode == "convert":
                dtype = self._operand_dtype(comp, instr.operands[0])
        return dtype

    def _walk_up(
        self, computation: _Computation, name: str, dot_op_name: str | None
    ) -> Iterator[tuple[_Computation, _Instruction]]:
        """Instructions behind a value through moves, fusion boundaries and inserted converts.

        Yields each convert it looks through; stops at anything that computes.
        """
        comp = computation
        for _ in range(_MAX_WALK):
            instr = comp.instructions.get(name)
            if instr is None or instr.is_tuple:
                return
            if instr.opcode == "parameter":
                caller = self.callers.get(comp.name)
                index = int(instr.operands[0].name) if instr.operands else -1
                if caller is None or not 0 <= index < len(caller[1].operands):
                    return
                comp = self.computations[caller[0]]
                name = caller[1].operands[index].name
            elif instr.opcode in ("fusion", "call"):
                called = instr.attr(_CALLS)
                callee = self.computations.get(called["name"]) if called else None
                if callee is None or callee.root is None:
                    return
                comp, name = callee, callee.root
            elif instr.opcode in _MOVES and instr.operands:
                name = instr.operands[0].name
            elif instr.opcode == "convert" and instr.op_name in (None, dot_op_name):
                source = self._operand_dtype(comp, instr.operands[0])
                if not (_is_float(source) and _is_float(instr.dtype)):
                    return
                if _bits(source) >= _bits(instr.dtype):
                    return
                yield comp, instr
                name = instr.operands[0].name
            else:
                return

    def _operand_dtype(self, computation: _Computation, operand: _Operand) -> str:
        if operand.dtype is not None:
            return operand.dtype
        source = computation.instructions.get(operand.name)
        return source.dtype if source is not None else ""


def _defined(computation: _Computation, operand: _Operand, user: _Instruction) -> _Instruction:
    source = computation.instructions.get(operand.name)
    if source is None:
        raise HloComputeError(
            f"%{user.name} in computation {computation.name}: operand %{operand.name} is "
            "printed without a shape and is not defined in the same computation; pass the "
            "text of the whole module (compiled.as_text())"
        )
    return source


def _ints(found: re.Match[str] | None) -> tuple[int, ...]:
    return tuple(int(d) for d in found["dims"].split(",") if d) if found else ()


def _is_float(dtype: str) -> bool:
    return re.match(r"^b?f\d", dtype) is not None


def _bits(dtype: str) -> int:
    """Width of a dtype's elements (bf16 -> 16, f8e4m3fn -> 8, s8 -> 8, tf32 -> 19)."""
    if dtype == "tf32":
        return 19
    found = re.search(r"\d+", dtype)
    return int(found[0]) if found else 0


def _precision_of(attrs: str) -> str | None:
    """The dtype an f32 dot or convolution asks to multiply in, from its HLO attributes."""
    algorithm = _ALGORITHM.search(attrs)
    precision = _PRECISION.search(attrs)
    operands = (precision["lhs"], precision["rhs"]) if precision else ()
    return _asked_dtype(operands, algorithm["name"] if algorithm else "")


def _asked_dtype(operand_precision: Sequence[str], algorithm: str) -> str | None:
    """None for the default precision (the operands' dtype), else the dtype asked for.

    `algorithm` is a dot algorithm without its "dot_" prefix: <lhs>_<rhs>_<accumulator>
    [_x<passes>], e.g. "bf16_bf16_f32". Multi-pass algorithms (bf16_bf16_f32_x3) emulate f32
    and count as f32, keeping the FLOPs those of the program (and of the cost analysis).
    """
    if algorithm and algorithm != "unset":
        parts = algorithm.split("_")
        if re.fullmatch(r"x\d+", parts[-1]) or parts[0] == "any":
            return None
        return parts[0]
    if len(operand_precision) == 2 and set(operand_precision) == {"high"}:
        return "tf32"  # JAX's "tensorfloat32" precision: Precision.HIGH on both operands
    return None


def _cublas_config(instr: _Instruction) -> dict[str, Any]:
    found = instr.attr(_BACKEND_CONFIG)
    try:
        config = json.loads(found["json"]) if found else {}
    except json.JSONDecodeError:
        config = {}
    gemm = config.get("gemm_backend_config", config)
    if not isinstance(gemm, dict) or "dot_dimension_numbers" not in gemm:
        raise HloComputeError(
            f"custom-call %{instr.name}: expected a cuBLAS backend_config with "
            "dot_dimension_numbers, found none; pass the optimised HLO text unchanged"
        )
    return gemm


def _convolution_flops(instr: _Instruction, lhs: tuple[int, ...], rhs: tuple[int, ...]) -> float:
    """XLA's GetConvolutionFlops: 2 * FMAs over the taps that land inside the input."""
    labels = instr.attr(_DIM_LABELS)
    if labels is None:
        raise HloComputeError(
            f"convolution %{instr.name}: expected dim_labels=..._...->... in its attributes, "
            f"found {instr.attrs[:200]!r}"
        )
    lhs_labels, rhs_labels, out_labels = labels["lhs"], labels["rhs"], labels["out"]
    out = instr.dims
    spatial = sorted(c for c in lhs_labels if c.isdigit())
    window = instr.attr(_WINDOW)
    fields = _window_fields(window["body"] if window else "", len(spatial), instr.name)
    valid = 1
    for k, digit in enumerate(spatial):
        valid *= _valid_positions(
            input_size=lhs[lhs_labels.index(digit)],
            kernel_size=rhs[rhs_labels.index(digit)],
            output_size=out[out_labels.index(digit)],
            stride=fields["stride"][k],
            pad_low=fields["pad_low"][k],
            base_dilation=fields["lhs_dilate"][k],
            window_dilation=fields["rhs_dilate"][k],
        )
    feature_groups = _int_attr(instr.attrs, "feature_group_count")
    batch_groups = _int_attr(instr.attrs, "batch_group_count")
    input_features = lhs[lhs_labels.index("f")]
    output_features = out[out_labels.index("f")]
    batch = lhs[lhs_labels.index("b")]
    fmas = (input_features // feature_groups) * output_features * (batch // batch_groups) * valid
    return 2.0 * fmas


def _int_attr(attrs: str, key: str) -> int:
    found = re.search(rf"\b{key}=(\d+)", attrs)
    return int(found[1]) if found else 1


def _window_fields(body: str, rank: int, name: str) -> dict[str, list[int]]:
    """stride, pad_low, lhs_dilate, rhs_dilate per spatial dimension (XLA defaults if absent)."""
    fields = {key: [1] * rank for key in ("stride", "lhs_dilate", "rhs_dilate")}
    fields["pad_low"] = [0] * rank
    for item in body.split():
        key, _, value = item.partition("=")
        parts = value.split("x")
        if len(parts) != rank:
            continue  # size= and rhs_reversal= are not needed
        if key == "pad":
            fields["pad_low"] = [int(p.split("_")[0]) for p in parts]
        elif key in fields:
            fields[key] = [int(p) for p in parts]
    if any(v < 1 for key in ("stride", "lhs_dilate", "rhs_dilate") for v in fields[key]):
        raise HloComputeError(f"convolution %{name}: expected window strides and dilations >= 1")
    return fields


def _valid_positions(
    *,
    input_size: int,
    kernel_size: int,
    output_size: int,
    stride: int,
    pad_low: int,
    base_dilation: int,
    window_dilation: int,
) -> int:
    """(output, kernel) position pairs of one spatial dimension that read a real input."""
    if stride == 1 and base_dilation == 1:  # XLA's closed form: one range per kernel tap
        return sum(
            max(min(input_size + low, output_size) - max(low, 0), 0)
            for low in (pad_low - k * window_dilation for k in range(kernel_size))
        )
    count = 0
    for kernel in range(kernel_size):
        for out in range(output_size):
            index = out * stride - pad_low + kernel * window_dilation
            if index % base_dilation:
                continue  # lands between dilated input elements
            if 0 <= index // base_dilation < input_size:
                count += 1
    return count


def hlo_dtype(name: str) -> str:
    """The HLO spelling of a NumPy/JAX dtype name: `float32` -> `f32`, `bfloat16` -> `bf16`,
    `int8` -> `s8`, `float8_e4m3fn` -> `f8e4m3fn` (names already in HLO spelling pass)."""
    if name in DOT_DTYPES:
        return name
    if name == "bfloat16":
        return "bf16"
    for prefix, short in (("float", "f"), ("uint", "u"), ("int", "s"), ("complex", "c")):
        if name.startswith(prefix):
            return short + name[len(prefix) :].replace("_", "")
    return name
