"""What the profile cache keeps per program: its key (everything that changes the program or
its price) and its record (what profiling it gave)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Literal

from explorer.errors import CacheError

__all__ = ["ProfileRecord", "ProgramKey", "Status"]

Status = Literal["ok", "infeasible"]
STATUSES: frozenset[str] = frozenset({"ok", "infeasible"})


@dataclass(frozen=True, slots=True)
class ProgramKey:
    """Everything that changes a profiled program or its price."""

    segment: str  # segment fingerprint, or "reshard:<fp_before>-><fp_after>"
    config: str  # e.g. "M@x,N@x,K@x,M@x"
    mesh: str  # e.g. "2x4(x,y)"
    platform: str  # platform name plus a content hash of its file
    backend: str  # "compiled" | "measured"
    jax_version: str
    extra: str = ""  # anything else that changes the program, e.g. a model hash

    def digest(self) -> str:
        """Stable sha256 hex of every field (field names included, so fields cannot alias)."""
        # every field is a string, so the fields as read are what `dataclasses.asdict` would
        # copy, without its deep copy: a warm case asks for tens of thousands of digests
        fields = {name: getattr(self, name) for name in _KEY_FIELDS}
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


_KEY_FIELDS = tuple(field.name for field in dataclasses.fields(ProgramKey))


@dataclass(frozen=True, slots=True)
class ProfileRecord:
    """The profiling result of one program."""

    key: ProgramKey
    status: Status
    t_comm: float  # seconds
    t_comp: float  # seconds
    memory: int  # peak bytes per device
    persistent_memory: int
    transient_memory: int
    collectives: str  # JSON text listing the collectives
    reason: str  # why infeasible; "" if ok
    seconds: float  # how long profiling this program took
    created: float  # unix time
    # The compiler's cost analysis, kept so a compiled profile can be re-priced on another
    # platform without compiling again.
    flops: float = 0.0
    bytes_accessed: float = 0.0
    # FLOPs of the dots and convolutions per dtype (JSON object, see profile.compute), so
    # compute is priced at each dtype's peak; "" in rows from before it was recorded
    dot_flops: str = "{}"
    # what the step holds for the program beyond `persistent_memory` (whole step) and
    # `transient_memory` (while it runs): from its forward part to its backward part, and
    # gradients from its backward part to another instance's optimizer (accounting.HeldMemory);
    # -1 in rows from before they were recorded
    saved_memory: int = dataclasses.field(kw_only=True)
    gradient_memory: int = dataclasses.field(kw_only=True)
    # values made from constants alone, held once per segment type (accounting.HeldMemory);
    # -1 in rows from before it was recorded
    constant_memory: int = dataclasses.field(kw_only=True)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise CacheError(
                f"a profile record's status must be one of {sorted(STATUSES)}, found "
                f"{self.status!r} for segment {self.key.segment!r} config {self.key.config!r}"
            )
