"""The hand-off between the cuts: a segment instance's forward ops and blocks, before the
backward and optimizer ops are placed."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _Group:
    label: str
    forward_ops: list[int]
    blocks: list[int]
    part: int = 0  # 1, 2, ... for the parts of a group split over the configuration cap
    # a scan's update segment: the parameters the scan reads, whose updates (and gradient
    # assembly) no single iteration owns
    collects: frozenset[int] = field(default_factory=frozenset)
    decider: int | None = None  # the block that decides the layout of what it collects


# owners outside every part: the ops before the first part, and the loss after the last
_PREFIX, _TAIL = -1, -2
