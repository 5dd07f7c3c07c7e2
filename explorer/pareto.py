"""Pareto pruning for the solver: the partial plans of a class that no other dominates on
time, held memory and memory reached (`_skyline`), and the time/memory filter of the final
plans (`_pareto`), as vectorised passes over flat arrays."""

from __future__ import annotations

import numpy as np


def _skyline(
    group: np.ndarray, times: np.ndarray, held: np.ndarray, total: np.ndarray
) -> np.ndarray:
    """Indices, in class and time order, of the partial plans no earlier one (in time order)
    of the same class dominates.

    Plan B dominates plan A, whatever follows, when it is no slower, holds no more into later
    levels and has reached no higher a level: every later level is no higher under B, nor is
    the largest. (A dominated plan may survive: harmless, the final frontier is filtered
    strictly.)
    """
    # by class, then time; equal times keep their order (two stable sorts: the class ids,
    # few and small, sort by radix)
    by_time = np.argsort(times, kind="stable")
    small = np.int16 if group.max(initial=0) < np.iinfo(np.int16).max else np.int64
    order = by_time[np.argsort(group[by_time].astype(small), kind="stable")]
    run = np.concatenate(([0], np.cumsum(group[order][1:] != group[order][:-1])))
    # A cheap first sweep: an earlier plan whose whole memory is below what this one holds
    # dominates it. Dominance is transitive, so the exact sweep below need only look at the
    # survivors.
    lowest = _earlier_least_value(total[order], run)
    alive = lowest > held[order]
    order, run = order[alive], run[alive]
    holds, reached = held[order], total[order]
    headroom = reached - holds
    tiers = np.unique(headroom)
    if len(tiers) <= 4 * np.log2(max(len(order), 2)) + 8:
        dominated = _dominated_in_tiers(run, holds, headroom, tiers)
    else:
        dominated = _dominated_by_earlier(run, holds, reached)
    return np.asarray(order[~dominated])


def _dominated_in_tiers(
    run: np.ndarray, held: np.ndarray, headroom: np.ndarray, tiers: np.ndarray
) -> np.ndarray:
    """`_dominated_by_earlier` where the points take few distinct headrooms (`tiers`, total
    - held): one linear pass per tier. A plan with headroom c that holds at most
    min(held, total - c) of another dominates it."""
    distinct, rank = np.unique(held, return_inverse=True)
    least_held = np.append(distinct, np.iinfo(np.int64).max)
    tier = np.searchsorted(tiers, headroom)
    dominated = np.zeros(len(held), dtype=bool)
    for value in np.flatnonzero(np.bincount(tier)):
        # least held memory among the earlier plans of the run in this tier
        in_tier = np.where(tier == value, rank, len(distinct))
        earlier = least_held[_earlier_least(in_tier, run, len(distinct))]
        dominated |= earlier <= np.minimum(held, held + headroom - tiers[value])
    return dominated


def _dominated_by_earlier(run: np.ndarray, held: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Per point, whether an earlier point of its run (`run` non-decreasing) holds no more
    and reached no higher: exact, by halving (each point is compared with the earlier half
    of every block it lies in, for blocks of 2, 4, 8, ... points: log n sorted passes)."""
    count = len(held)
    dominated = np.zeros(count, dtype=bool)
    if count < 2:
        return dominated
    rank = np.unique(held, return_inverse=True)[1].astype(np.int64)
    level = np.unique(total, return_inverse=True)[1].astype(np.int64)  # compared by rank
    span = int(rank.max()) + 1
    position = np.arange(count)
    width = 1
    while width < count:
        block = position // (2 * width)
        # a segment: the points of one block and one run (the only ones that can compare)
        starts = np.ones(count, dtype=bool)
        starts[1:] = (block[1:] != block[:-1]) | (run[1:] != run[:-1])
        segment = np.cumsum(starts) - 1
        earlier = (position // width) % 2 == 0
        later = ~earlier
        # the earlier halves by (segment, held), each with the least total up to it
        keys = segment[earlier] * span + rank[earlier]
        by_key = np.argsort(keys, kind="stable")
        keys, ranks = keys[by_key], level[earlier][by_key]
        # keys sort by segment first, so the earlier points' segments stay non-decreasing
        least = np.minimum(_earlier_least(ranks, keys // span, count), ranks)
        # per later point: the last earlier point of its segment holding no more than it
        at = np.searchsorted(keys, segment[later] * span + rank[later], side="right") - 1
        found = at >= 0
        found[found] &= keys[at[found]] // span == segment[later][found]
        hit = np.zeros(int(later.sum()), dtype=bool)
        hit[found] = least[at[found]] <= level[later][found]
        dominated[later] |= hit
        width *= 2
    return dominated


def _earlier_least_value(values: np.ndarray, run: np.ndarray) -> np.ndarray:
    """Per element, the least value before it in its run (`run` non-decreasing), or the
    largest int64 for the first of a run. Values are shifted to start at 0, so that the runs
    are kept apart with no sort, unless their range times the runs could overflow."""
    none = np.iinfo(np.int64).max
    if len(values) == 0:
        return values
    low, high = int(values.min()), int(values.max())
    span = high - low + 1
    if span * (int(run[-1]) + 2) >= 2**62:  # rank them instead: a sort, but no overflow
        distinct, rank = np.unique(values, return_inverse=True)
        return np.append(distinct, none)[_earlier_least(rank, run, len(distinct))]
    least = _earlier_least(values - low, run, span)
    return np.where(least == span, none, least + low)


def _earlier_least(rank: np.ndarray, run: np.ndarray, none: int) -> np.ndarray:
    """Per element, the least rank before it in its run (`run` non-decreasing, ranks at most
    `none`), or `none` for the first of a run."""
    # earlier runs get higher keys, so a running minimum never reaches back into one
    offset = (run[-1] - run) * (none + 1)
    running = np.minimum.accumulate(offset + rank)
    return np.minimum(np.concatenate(([none], running[:-1] - offset[1:])), none)


def _pareto(times: np.ndarray, memory: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both time and memory."""
    order = np.lexsort((memory, times))
    best = np.minimum.accumulate(memory[order])
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = memory[order][1:] < best[:-1]
    return np.asarray(order[keep])
