"""Pytree paths of step inputs and outputs: the part below the top-level argument, and the
entry of a table whose path ends (or shares the longest tail with) a given one."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TypeVar

T = TypeVar("T")


def path_suffix(path: str) -> str:
    """The path below the top-level argument: `params['w']` -> `['w']`, `[1]['w']` -> `['w']`."""
    for index, char in enumerate(path):
        if char in "[." and index > 0:
            if path[0] == "[":
                end = path.index("]") + 1
                return path[end:]
            return path[index:]
    if path.startswith("["):
        return path[path.index("]") + 1 :]
    return ""


def match_suffix(
    path: str, shape: tuple[int, ...], by_suffix: Mapping[tuple[str, tuple[int, ...]], T]
) -> T | None:
    """The entry whose path ends `path` with the same shape, longest suffix first (e.g. the
    parameter an optimizer-state leaf belongs to)."""
    for index in range(len(path)):
        if path[index] in "[.":
            found = by_suffix.get((path[index:], shape))
            if found is not None:
                return found
    return _match_tail(path, shape, by_suffix)


_COMPONENT = re.compile(r"\[[^\]]*\]|\.[A-Za-z_]\w*")


def _match_tail(
    path: str, shape: tuple[int, ...], by_suffix: Mapping[tuple[str, tuple[int, ...]], T]
) -> T | None:
    """The entry sharing the longest tail of path components with `path`, when unique.

    A Flax `TrainState` keeps `state.params['params']['Dense_0']['kernel']` and its Adam
    moment at `state.opt_state[0].mu['params']['Dense_0']['kernel']`: neither path ends the
    other, but they share `['params']['Dense_0']['kernel']`. A tail of one component (a bare
    `['kernel']`) is not enough to tell parameters apart.
    """
    mine = _COMPONENT.findall(path)
    best: list[T] = []
    longest = 1
    for (suffix, key_shape), entry in by_suffix.items():
        if key_shape != shape:
            continue
        theirs = _COMPONENT.findall(suffix)
        common = 0
        while common < min(len(mine), len(theirs)) and mine[-1 - common] == theirs[-1 - common]:
            common += 1
        if common > longest:
            best, longest = [entry], common
        elif common == longest and common > 1:
            best.append(entry)
    return best[0] if len(best) == 1 else None
