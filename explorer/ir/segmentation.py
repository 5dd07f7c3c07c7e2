"""Segments: the unique segment types, their instances in program order and the tensors
crossing between consecutive instances."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SegmentType:
    """A unique segment: every instance with this fingerprint is profiled once."""

    id: int
    fingerprint: str
    label: str  # e.g. "layer", "embed", "head"
    block_count: int
    instance_count: int


@dataclass(frozen=True, slots=True)
class SegmentInstance:
    index: int
    unique_id: int
    label: str  # the scope label of the instance, e.g. "layer_3"
    blocks: tuple[int, ...]  # block indices, in order
    ops: tuple[int, ...]  # every op of the instance: forward, backward, optimizer


@dataclass(frozen=True, slots=True)
class Boundary:
    """Tensors crossing from instance `before` to instance `before + 1`."""

    before: int
    forward: tuple[int, ...]  # values made by `before`'s forward ops, read by the next's
    backward: tuple[int, ...]  # cotangents made by the next's backward, read by `before`'s


@dataclass(frozen=True, slots=True)
class Segmentation:
    instances: tuple[SegmentInstance, ...]
    unique: tuple[SegmentType, ...]
    boundaries: tuple[Boundary, ...]
    segment_of_op: tuple[int, ...]
    method: str  # "scopes" or "repeats"
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for i, instance in enumerate(self.instances):
            if instance.index != i:
                raise ValueError(f"segment instance at {i} has index {instance.index}")
        if len(self.boundaries) != max(0, len(self.instances) - 1):
            raise ValueError("one boundary between each pair of consecutive instances")

    @property
    def reuse_found(self) -> bool:
        return len(self.unique) < len(self.instances)

    def summary(self) -> str:
        lines = [
            f"{len(self.instances)} segment instances of {len(self.unique)} unique types "
            f"(by {self.method})"
        ]
        for unique in self.unique:
            lines.append(
                f"  type {unique.id} {unique.label!r}: {unique.block_count} blocks "
                f"x{unique.instance_count}"
            )
        lines.extend(f"  note: {note}" for note in self.notes)
        return "\n".join(lines)
