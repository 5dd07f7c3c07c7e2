"""Affine index dependencies between an op's operands and its result (CFP paper, Sec. 3).

For an op with result `o` and operand `a`, each operand dim's index is written as a function of
the result's indices. Every form the paper lists (identity, permutation, reshape split
`K*a_j + a_k`, reshape merge `floor(a_k/K)`, `a_k % K`, broadcast, reduction `*`) is a mixed-radix
number whose digits are slices of result dims, so that is the representation:

    a_i = sum_k digit_k * place_k,   digit = floor(o_j / q) mod m   (or `*`: every value < m)

listed most significant first. Maps compose along a path by substituting digits, and the
paper's Eq. 2 (an even P-way block split of `a_i` is an even P-way block split of some `o_j`)
becomes a check of the leading digit. A convolution is a contraction whose feature groups are
one more digit of the output feature. Forms we cannot express exactly (slicing a dim, gathers,
cumulative sums along a dim) are `Opaque`: they record which result dims they read but never
preserve a split.

Modules: `expressions` (digits, dim expressions, maps and their composition), `primitives`
(the map of each primitive).
"""

from explorer.affine.expressions import AffineMap, Digit, DimExpr
from explorer.affine.primitives import (
    CUMULATIVE,
    ELEMENTWISE,
    REDUCTIONS,
    SOURCES,
    broadcast,
    conv_general_dilated,
    dot_general,
    identity,
    op_maps,
    reduce,
    reshape,
    traced_op_maps,
    transpose,
)

__all__ = [
    "CUMULATIVE",
    "ELEMENTWISE",
    "REDUCTIONS",
    "SOURCES",
    "AffineMap",
    "Digit",
    "DimExpr",
    "broadcast",
    "conv_general_dilated",
    "dot_general",
    "identity",
    "op_maps",
    "reduce",
    "reshape",
    "traced_op_maps",
    "transpose",
]
