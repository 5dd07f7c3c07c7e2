"""A small reader of HLO text: computations, instructions and their operands, as
`compute.dot_flops` needs them (shapes, opcodes, attributes and the JAX op name of each).

An instruction is parsed from its line only when first asked for: a training step's module
is mostly fused arithmetic no FLOP count reads (dropout's random bits are nine tenths of a
small GPT step's lines), and parsing every line was most of pricing a compiled step."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_SHAPE = re.compile(r"(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\]")
_HEAD = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*")
_OPCODE = re.compile(r"\s*(?P<opcode>[\w\-$]+)\(")
_COMMENT = re.compile(r"/\*.*?\*/")
_METADATA = re.compile(r'metadata=\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}')
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_BRACKET = re.compile(r"[()\[\]{}]")
_BRACKET_OR_COMMA = re.compile(r"[()\[\]{},]")


@dataclass(frozen=True, slots=True)
class _Operand:
    name: str
    dtype: str | None  # None when the text prints the operand without its shape
    dims: tuple[int, ...] | None


@dataclass(frozen=True, slots=True)
class _Instruction:
    name: str
    dtype: str  # of the first array of the result (cuBLAS calls return (result, workspace))
    dims: tuple[int, ...]
    is_tuple: bool
    opcode: str
    operands: tuple[_Operand, ...]
    attrs: str  # everything after the operands, metadata removed
    op_name: str | None  # the JAX op name of the metadata, if any

    def attr(self, pattern: re.Pattern[str]) -> re.Match[str] | None:
        return pattern.search(self.attrs)


class _Instructions:
    """The instructions of one computation by name, each parsed when first asked for."""

    __slots__ = ("_lines", "_parsed")

    def __init__(self, lines: dict[str, str]) -> None:
        self._lines = lines  # name -> its line, in the computation's order
        self._parsed: dict[str, _Instruction | None] = {}

    def get(self, name: str) -> _Instruction | None:
        """The instruction `name` defines; None where no line of it parses as one."""
        if name not in self._parsed:
            line = self._lines.get(name)
            self._parsed[name] = None if line is None else _parse_instruction(line)
        return self._parsed[name]

    def with_text(self, *needles: str) -> Iterator[_Instruction]:
        """In order, the instructions whose line holds one of `needles` (a cheap filter on
        the text: the caller still checks what it parsed)."""
        for name, line in self._lines.items():
            if any(needle in line for needle in needles):
                found = self.get(name)
                if found is not None:
                    yield found


@dataclass(frozen=True, slots=True)
class _Computation:
    name: str
    instructions: _Instructions
    root: str | None  # the name its ROOT line defines


def _read_computations(text: str) -> dict[str, _Computation]:
    """Every computation of the module `text`, its instructions left unparsed."""
    computations: dict[str, _Computation] = {}
    for name, body in _computation_blocks(text):
        lines: dict[str, str] = {}
        root = None
        for line in body:
            head = _HEAD.match(line)
            if head is None:
                continue
            lines[head["name"]] = line
            if line.lstrip().startswith("ROOT "):
                root = head["name"]
        computations[name] = _Computation(name, _Instructions(lines), root)
    return computations


def _computation_blocks(text: str) -> Iterator[tuple[str, list[str]]]:
    """(name, body lines) of each computation: a header line ending in '{' up to a '}'."""
    name: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if name is None:
            if line.endswith("{") and not line.startswith(("HloModule", " ", "\t")):
                head = re.match(r"^(?:ENTRY\s+)?%?(?P<name>[^\s(]+)", line)
                if head:
                    name, body = head["name"], []
            continue
        if line.strip() == "}":
            yield name, body
            name = None
        else:
            body.append(line)


def _parse_instruction(line: str) -> _Instruction | None:
    head = _HEAD.match(line)
    if head is None:
        return None
    shape, pos = _take_shape(line, head.end())
    opcode = _OPCODE.match(line, pos)
    if opcode is None:
        return None
    start = opcode.end()
    end = _closing(line, start - 1)
    args, rest = line[start:end], line[end + 1 :]
    first = _SHAPE.search(shape)
    op_name = _OP_NAME.search(rest)
    operands = () if opcode["opcode"] == "constant" else tuple(_operands(args))
    return _Instruction(
        name=head["name"],
        dtype=first["dtype"] if first else "",
        dims=_dims(first["dims"]) if first else (),
        is_tuple=shape.startswith("("),
        opcode=opcode["opcode"],
        operands=operands,
        attrs=_METADATA.sub("", rest),
        op_name=op_name[1] if op_name else None,
    )


def _take_shape(line: str, pos: int) -> tuple[str, int]:
    if line.startswith("(", pos):  # a tuple shape: up to its closing parenthesis
        end = _closing(line, pos)
        return line[pos : end + 1], end + 1
    end = line.find(" ", pos)
    end = len(line) if end < 0 else end
    return line[pos:end], end


def _closing(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at `open_at` (any of ([{ nest inside)."""
    depth = 0
    # only the brackets are visited (a Python loop over every character of a step's
    # instructions was a third of pricing a compiled step)
    for found in _BRACKET.finditer(text, open_at):
        if found[0] in "([{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return found.start()
    return len(text)


def _operands(args: str) -> Iterator[_Operand]:
    depth, start = 0, 0
    args = _COMMENT.sub("", args) + ","
    for found in _BRACKET_OR_COMMA.finditer(args):
        char = found[0]
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0:
            i = found.start()
            text = args[start:i].strip()
            start = i + 1
            if not text:
                continue
            name = text.rsplit(None, 1)[-1].lstrip("%")
            shape = _SHAPE.match(text) if " " in text else None
            yield _Operand(
                name,
                shape["dtype"] if shape else None,
                _dims(shape["dims"]) if shape else None,
            )


def _dims(text: str) -> tuple[int, ...]:
    # Bounded dynamic dimensions print as "<=8"; the bound is the size XLA allocates.
    return tuple(int(d.strip().lstrip("<=")) for d in text.split(",") if d.strip())
