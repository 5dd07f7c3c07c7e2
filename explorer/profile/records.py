"""Profiled programs as cache records (priced, infeasible, or where nothing moves) and as
typed profiles (`profile.profiles`), compiled profiles repriced for the platform they are read
for."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from typing import Any

from explorer.mesh import MeshSpec
from explorer.profile.backends import Backend, ProgramProfile, compute_time
from explorer.profile.cache_record import ProfileRecord, Status
from explorer.profile.hlo import Collective, CollectiveKind
from explorer.profile.jobs import _Context, _Job
from explorer.profile.profiles import Profile, ReshardProfile, SegmentProfile


def _record(job: _Job, profile: ProgramProfile, seconds: float) -> ProfileRecord:
    return ProfileRecord(
        key=job.key,
        status="ok",
        t_comm=profile.t_comm,
        t_comp=profile.t_comp,
        memory=profile.memory,
        persistent_memory=profile.persistent_memory,
        transient_memory=profile.transient_memory,
        saved_memory=profile.saved_memory,
        gradient_memory=profile.gradient_memory,
        constant_memory=profile.constant_memory,
        collectives=profile.collectives_json(),
        reason="",
        seconds=seconds,
        created=time.time(),
        flops=profile.flops,
        bytes_accessed=profile.bytes_accessed,
        dot_flops=profile.dot_flops_json(),
    )


def _nothing_moves(job: _Job) -> ProfileRecord:
    return _without_program(job, "ok", 0.0, reason="", seconds=0.0)


def _infeasible(job: _Job, reason: str, seconds: float) -> ProfileRecord:
    return _without_program(job, "infeasible", math.inf, reason=reason, seconds=seconds)


def _without_program(
    job: _Job, status: Status, each_time: float, *, reason: str, seconds: float
) -> ProfileRecord:
    """A row with no priced program: nothing held, no collectives, `each_time` per time."""
    return ProfileRecord(
        key=job.key,
        status=status,
        t_comm=each_time,
        t_comp=each_time,
        memory=0,
        persistent_memory=0,
        transient_memory=0,
        saved_memory=0,
        gradient_memory=0,
        constant_memory=0,
        collectives="[]",
        reason=reason,
        seconds=seconds,
        created=time.time(),
    )


def _profile(job: _Job, record: ProfileRecord, context: _Context, was_cached: bool) -> Profile:
    """The typed profile of `job` from its cache record, priced for the run's platform."""
    t_comm, t_comp = record.t_comm, record.t_comp
    combined: tuple[tuple[str, int, float], ...] = ()
    if record.status == "ok":
        if context.backend is Backend.COMPILED:
            t_comm, t_comp = reprice(record, context.platform, context.mesh, context.prices)
        saved, combined = combinable_latency(record.collectives, context.platform, context.mesh)
        # combinable all-reduces pay their latency once per combined bucket of the whole
        # step (cost.CostModel), not once per segment
        t_comm = max(t_comm - saved, 0.0)
    priced: dict[str, Any] = dict(
        label=job.label,
        config=job.config,
        t_comm=t_comm,
        t_comp=t_comp,
        memory=record.memory,
        persistent_memory=record.persistent_memory,
        transient_memory=record.transient_memory,
        saved_memory=record.saved_memory,
        gradient_memory=record.gradient_memory,
        constant_memory=record.constant_memory,
        status=record.status,
        reason=record.reason,
        collectives=record.collectives,
        cached=was_cached,
        seconds=record.seconds,
        combined=combined,
        # boundaries that move the same tensors share one program; none where nothing moves
        program="" if job.free else job.key.digest()[:16],
    )
    if isinstance(job.segment, int):  # a segment type's configuration
        return SegmentProfile(
            segment=job.segment, choices=job.choices, context=job.context, **priced
        )
    before, after = job.segment
    last, first = job.choices
    return ReshardProfile(before=before, after=after, last=last, first=first, **priced)


def collective_from_json(entry: dict[str, Any], nbytes: int | None = None) -> Collective:
    return Collective(
        kind=CollectiveKind(entry["kind"]),
        name="",
        shapes=(),
        nbytes=int(entry["bytes"]) if nbytes is None else nbytes,
        group_size=int(entry["group"]),
        axes=tuple(entry["axes"]),
        op_names=(entry.get("op", ""),),
        scattered_bytes=int(entry.get("scattered", 0)) if nbytes is None else 0,
    )


def reprice(
    record: ProfileRecord,
    platform: Any,
    mesh: MeshSpec,
    prices: dict[Collective, float] | None = None,
) -> tuple[float, float]:
    """(T_C, T_P) of a compiled profile on `platform`, from its collectives and cost.

    `prices` keeps each collective's price, for the next record on the same platform and
    mesh: a warm run reprices thousands of records with a few hundred shapes."""
    prices = {} if prices is None else prices
    t_comm = 0.0
    for entry in json.loads(record.collectives):
        # the price does not depend on which ops made the collective
        collective = replace(collective_from_json(entry), op_names=())
        price = prices.get(collective)
        if price is None:
            price = prices[collective] = platform.price(collective, mesh)
        t_comm += price
    dots = tuple(json.loads(record.dot_flops or "{}").items())
    return t_comm, compute_time(platform, dots, record.flops, record.bytes_accessed)


def combinable_latency(
    collectives: str, platform: Any, mesh: MeshSpec
) -> tuple[float, tuple[tuple[str, int, float], ...]]:
    """The latency a profile's combinable all-reduces paid, and their buckets.

    Returns (seconds of latency to take off the profile, per combining group (kind, axes,
    group size) the number of elements and that group's latency).
    """
    saved = 0.0
    groups: dict[str, tuple[int, float]] = {}
    for entry in json.loads(collectives):
        if not entry.get("combinable"):
            continue
        latency = platform.price(collective_from_json(entry, nbytes=0), mesh)
        saved += latency
        key = f"{entry['kind']}@{'+'.join(entry['axes'])}/{entry['group']}"
        count, _ = groups.get(key, (0, latency))
        groups[key] = (count + int(entry.get("elements", 1)), latency)
    return saved, tuple((k, n, lat) for k, (n, lat) in sorted(groups.items()))
