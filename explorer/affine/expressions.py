"""Affine index expressions: a dim's index as a mixed-radix number of digits sliced from the
result's indices (`Digit`, `DimExpr`), an op's map from result to operand (`AffineMap`), their
composition along a path and the paper's Eq. 2 check (`split_target`, `split_source`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Digit:
    """`floor(o[dim] / q) mod m` of the result index, or `*` (all m values) when dim is None."""

    dim: int | None
    q: int
    m: int

    @property
    def star(self) -> bool:
        return self.dim is None


@dataclass(frozen=True, slots=True)
class DimExpr:
    """One operand dim's index as a mixed-radix number of digits (most significant first).

    `opaque` marks a dependency we cannot express (then `reads` says on which result dims).
    An empty digit tuple is the constant 0 (a size-1 or broadcast dim).
    """

    digits: tuple[Digit, ...] = ()
    opaque: bool = False
    reads: tuple[int, ...] = ()

    # Made hundreds of thousands of times while a step's ops are placed, from a few distinct
    # (dim, size) pairs: the expressions are immutable, so each is made once and shared.
    @staticmethod
    @functools.cache
    def var(dim: int, size: int) -> DimExpr:
        return DimExpr((Digit(dim, 1, size),) if size > 1 else ())

    @staticmethod
    @functools.cache
    def star(size: int) -> DimExpr:
        return DimExpr((Digit(None, 1, size),) if size > 1 else ())

    @staticmethod
    def unknown(reads: Sequence[int]) -> DimExpr:
        return DimExpr((), True, tuple(sorted(set(reads))))

    @property
    def size(self) -> int:
        return math.prod(d.m for d in self.digits)

    def result_dims(self) -> tuple[int, ...]:
        if self.opaque:
            return self.reads
        return tuple(sorted({d.dim for d in self.digits if d.dim is not None}))


@dataclass(frozen=True, slots=True)
class AffineMap:
    """Operand index as a function of result index: one `DimExpr` per operand dim."""

    operand_shape: tuple[int, ...]
    result_shape: tuple[int, ...]
    exprs: tuple[DimExpr, ...]

    def __post_init__(self) -> None:
        if len(self.exprs) != len(self.operand_shape):
            raise ValueError("one DimExpr per operand dim expected")

    def compose(self, inner: AffineMap) -> AffineMap:
        """`self` maps T0 <- T1, `inner` maps T1 <- T2; the result maps T0 <- T2."""
        if inner.operand_shape != self.result_shape:
            raise ValueError(f"cannot compose: {inner.operand_shape} is not {self.result_shape}")
        return AffineMap(
            self.operand_shape,
            inner.result_shape,
            tuple(_substitute(e, inner) for e in self.exprs),
        )

    def evaluate(self, index: Sequence[int]) -> list[tuple[int, ...]]:
        """Every operand index the result element at `index` may read (brute force, for tests).

        An opaque dim contributes its whole range: a superset, never a miss.
        """
        per_dim: list[list[int]] = []
        for expr, size in zip(self.exprs, self.operand_shape, strict=True):
            if expr.opaque:
                per_dim.append(list(range(size)))
                continue
            values = [0]
            for digit in expr.digits:
                options = (
                    range(digit.m) if digit.star else [(index[digit.dim] // digit.q) % digit.m]  # type: ignore[index]
                )
                values = [v * digit.m + o for v in values for o in options]
            per_dim.append(values)
        out: list[tuple[int, ...]] = [()]
        for values in per_dim:
            out = [(*prefix, v) for prefix in out for v in values]
        return out

    def split_target(self, operand_dim: int, parts: int) -> int | None:
        """Eq. 2: the result dim an even `parts`-way split of `operand_dim` maps to, if any.

        Holds when the operand dim's leading digit is the top of one result dim `j`
        (`q * m == O_j`) and `parts` divides that digit, so block `k` of the operand dim is
        exactly block `k` of `o_j`.
        """
        if parts == 1:
            return None
        expr = self.exprs[operand_dim]
        if expr.opaque or not expr.digits or self.operand_shape[operand_dim] % parts:
            return None
        lead = expr.digits[0]
        if lead.star or lead.m % parts:
            return None
        assert lead.dim is not None
        if lead.q * lead.m != self.result_shape[lead.dim]:
            return None
        return lead.dim

    def split_source(self, result_dim: int, parts: int) -> int | None:
        """The operand dim that must be split `parts` ways for `result_dim` to be (inverse)."""
        for operand_dim in range(len(self.exprs)):
            if self.split_target(operand_dim, parts) == result_dim:
                return operand_dim
        return None


def _substitute(expr: DimExpr, inner: AffineMap) -> DimExpr:
    if expr.opaque:
        reads = {r for d in expr.reads for r in inner.exprs[d].result_dims()}
        return DimExpr.unknown(sorted(reads))
    digits: list[Digit] = []
    for digit in expr.digits:
        if digit.star:
            digits.append(digit)
            continue
        assert digit.dim is not None
        window = _window(inner.exprs[digit.dim], digit.q, digit.m)
        if window is None:
            reads = {r for d in expr.result_dims() for r in inner.exprs[d].result_dims()}
            return DimExpr.unknown(sorted(reads))
        digits.extend(window)
    return DimExpr(_merge(digits))


def _window(expr: DimExpr, q: int, m: int) -> list[Digit] | None:
    """Digits of `floor(expr / q) mod m`, or None when digit boundaries do not line up.

    A digit spanning place values [lo, hi) contributes its slice [a, b) inside the window
    [q, q*m) exactly when a is a multiple of lo, b of a, and hi of b (then no carry crosses
    the cut). Window places above the number's top are zeros and add no digit.
    """
    if expr.opaque:
        return None
    out: list[Digit] = []
    place = 1
    low, high = q, q * m
    for digit in reversed(expr.digits):
        lo, hi = place, place * digit.m
        place = hi
        a, b = max(lo, low), min(hi, high)
        if a >= b:
            continue
        if a % lo or b % a or hi % b:
            return None
        width = b // a
        out.append(
            Digit(None, 1, width) if digit.star else Digit(digit.dim, digit.q * (a // lo), width)
        )
    if place < high and (place > low and place % low):
        return None
    return list(reversed(out))


def _merge(digits: list[Digit]) -> tuple[Digit, ...]:
    """Fuse adjacent digits that are consecutive slices of the same dim (or both `*`)."""
    out: list[Digit] = []
    for digit in digits:
        if digit.m == 1:
            continue
        if out:
            prev = out[-1]
            if prev.star and digit.star:
                out[-1] = Digit(None, 1, prev.m * digit.m)
                continue
            if prev.dim is not None and prev.dim == digit.dim and prev.q == digit.q * digit.m:
                out[-1] = Digit(prev.dim, digit.q, prev.m * digit.m)
                continue
        out.append(digit)
    return tuple(out)
