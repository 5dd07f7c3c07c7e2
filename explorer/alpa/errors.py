"""What the Alpa-style ILP raises and warns."""

from __future__ import annotations

from explorer.errors import ExplorerError


class AlpaError(ExplorerError):
    """The Alpa-style ILP found no plan within its limits."""


class AlpaBudgetError(AlpaError):
    """No assignment of strategies fits the per-device memory budget."""


class AlpaTimeLimitWarning(UserWarning):
    """HiGHS stopped at its time limit: the plan is the best found, not proven optimal."""
