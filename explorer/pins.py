"""Pins as users write them (`{3: "N@x"}` for a block, `{"layer": {0: "N@x"}}` for a position
of every instance of a segment type), checked and turned into what the solver takes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from explorer.errors import PinError
from explorer.ir import BlockAnalysis, Segmentation


def solver_pins(
    pins: Mapping[Any, Any] | None, blocks: BlockAnalysis, segments: Segmentation
) -> dict[int, dict[int, int]]:
    """`pins` as the solver takes them (instance -> block position -> strategy index),
    every entry checked: a `PinError` names the pin, what was expected and what exists."""
    if pins is None:
        return {}
    if not isinstance(pins, Mapping):
        raise PinError(
            f"pins: expected a dict such as {{3: 'N@x'}} (block index -> strategy) or "
            f"{{'layer': {{0: 'N@x'}}}} (segment type -> block position -> strategy), found "
            f"{type(pins).__name__} {pins!r}"
        )
    labels = sorted({u.label for u in segments.unique})
    out: dict[int, dict[int, int]] = {}
    for key, value in pins.items():
        if isinstance(key, bool) or not isinstance(key, (int, str)):
            raise PinError(
                f"pins: expected keys that are block indices (0..{len(blocks.blocks) - 1}) or "
                f"segment type labels ({labels}), found {type(key).__name__} {key!r}"
            )
        if isinstance(key, int):
            if not 0 <= key < len(blocks.blocks):
                raise PinError(
                    f"pins[{key!r}]: expected a block index 0..{len(blocks.blocks) - 1} or a "
                    f"segment type label ({labels}), found no block {key}"
                )
            wanted = [
                (n, inst.blocks.index(key), value)
                for n, inst in enumerate(segments.instances)
                if key in inst.blocks
            ]
        else:
            if key not in labels:
                raise PinError(
                    f"pins[{key!r}]: expected a segment type label (one of {labels}) or a "
                    f"block index 0..{len(blocks.blocks) - 1}, found no type {key!r}"
                )
            if not isinstance(value, Mapping):
                raise PinError(
                    f"pins[{key!r}]: expected a dict of block position in the segment -> "
                    f"strategy name, such as {{0: 'N@x'}}, found {type(value).__name__} "
                    f"{value!r}"
                )
            wanted = []
            for n, inst in enumerate(segments.instances):
                if segments.unique[inst.unique_id].label != key:
                    continue
                for pos, name in value.items():
                    if isinstance(pos, bool) or not isinstance(pos, int):
                        raise PinError(
                            f"pins[{key!r}]: expected int block positions, found "
                            f"{type(pos).__name__} {pos!r}"
                        )
                    if not 0 <= pos < len(inst.blocks):
                        raise PinError(
                            f"pins[{key!r}][{pos!r}]: expected a block position 0.."
                            f"{len(inst.blocks) - 1} of segment type {key!r}, found "
                            f"position {pos}"
                        )
                    wanted.append((n, pos, name))
        for n, pos, name in wanted:
            block = blocks.blocks[segments.instances[n].blocks[pos]]
            names = [s.name for s in block.strategies]
            if not isinstance(name, str) or name not in names:
                raise PinError(
                    f"pins[{key!r}]: block {block.index} ({block.scope}) has no strategy "
                    f"{name!r}: expected one of {names}, found {name!r}"
                )
            out.setdefault(n, {})[pos] = names.index(name)
    return out
