"""What the explorer app knows, in one place.

`Settings` is what a run is made of (the controls' values when the run button was pressed);
`Session` is the one mutable record of the app: the analysis, the budget and pins, the plan
they give, and what is selected. Views never keep state of their own beyond their figures.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from explorer.compiled_fit import CompiledFit
    from explorer.pipeline import Analysis, SegmentedStep
    from explorer.plan import Plan
    from explorer.ui.bars import Symbolic
    from explorer.ui.table import BaselineRow


@dataclass(frozen=True, slots=True)
class Settings:
    model: str = "gpt"
    preset: str = "tiny"
    layers: int | None = None  # None: the preset's depth
    mesh: tuple[int, ...] = (8,)
    platform: str = "a100-pcie-8"
    backend: str = "compiled"
    quick: bool = False  # profile paired strategies only (see paired_strategies)

    def __post_init__(self) -> None:
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers: expected a positive int or None, found {self.layers}")

    @property
    def mesh_text(self) -> str:
        return "x".join(map(str, self.mesh))


@dataclass(frozen=True, slots=True)
class Choice:
    """The plan the solver picked, in the terms the views need, without its layouts.

    A budget move is a frontier lookup; turning its selection into this takes microseconds,
    while building the full `Plan` (every value's PartitionSpec) takes most of a second on a
    48-layer model. So views draw from a `Choice`, and the `Plan` is built when something
    needs it (export, op-level PartitionSpecs, the baseline table).
    """

    time: float  # predicted seconds per step
    memory: int  # predicted bytes per device
    configs: tuple[str, ...]  # configuration per segment instance
    strategies: tuple[str, ...]  # strategy per block
    budget: float | None
    pins: tuple[tuple[int, str], ...] = ()
    uniform: bool = False


def choice_from_point(analysis: Analysis, point: Any, budget: float | None) -> Choice:
    """A frontier point's selection named through the analysis's cost model."""
    model = analysis.cost_model
    assert model is not None
    strategies = [""] * len(analysis.blocks)
    configs = []
    for n, instance in enumerate(analysis.segments.instances):
        option = model.options[n][point.selection[n]]
        configs.append(option.name)
        for block, choice in zip(instance.blocks, option.choices, strict=True):
            strategies[block] = analysis.blocks[block].strategies[choice].name
    return Choice(point.time, point.memory, tuple(configs), tuple(strategies), budget)


@dataclass(frozen=True, slots=True)
class FitCheck:
    """What `Explorer.check_fit` found: the fastest frontier plan whose compiled whole step
    fits the budget (`explorer.fastest_plan_that_fits`), for the analysis, pins and mode it
    was asked under."""

    analysis: Any
    pins: tuple[tuple[int, str], ...]
    uniform: bool
    budget: float | None  # the session's (None: the device's memory, `fit.budget`)
    fit: CompiledFit

    def asked_as(self, session: Session) -> bool:
        """Whether `session` still has the analysis, pins, mode and budget it was asked under."""
        return session.analysis is self.analysis and (
            tuple(sorted(session.pins.items())),
            session.uniform,
            session.budget,
        ) == (self.pins, self.uniform, self.budget)

    def shows(self, choice: Choice | None, analysis: Any) -> bool:
        """Whether `choice` (of `analysis`) is the plan this check compiled and found to fit."""
        return (
            choice is not None
            and analysis is self.analysis
            and choice.pins == self.pins
            and choice.uniform == self.uniform
            and choice.strategies == tuple(self.fit.plan.strategies)
            and choice.time == self.fit.plan.time
        )


@dataclass
class Session:
    settings: Settings
    analysis: SegmentedStep | None = None  # an `Analysis` once profiled
    budget: float | None = None  # bytes per device; None: the fastest plan
    pins: dict[int, str] = field(default_factory=dict)  # block index -> strategy name
    uniform: bool = False
    choice: Choice | None = None
    plan: Plan | None = None  # the full plan of `choice`, once something asked for it
    # (analysis, pins, uniform, frontier): the frontier solved for those pins and that mode
    pinned: tuple[Any, tuple[tuple[int, str], ...], bool, Any] | None = None
    selected: int = 0  # segment instance shown in the bars (and expanded at op level)
    analysis_key: tuple[Any, ...] = ()  # the model the selection belongs to
    level: str = "blocks"  # "blocks" or "ops"
    baselines: tuple[BaselineRow, ...] = ()
    exported: str = ""  # path of the last export
    check: FitCheck | None = None  # the last compiled check of a plan shown


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the app showed before a run, put back when the run fails or is cancelled."""

    settings: Settings
    analysis: SegmentedStep | None
    budget: float | None
    pins: tuple[tuple[int, str], ...]
    uniform: bool
    selected: int
    analysis_key: tuple[Any, ...]
    level: str
    baselines: tuple[BaselineRow, ...]
    symbolic: Symbolic
    notes: tuple[str, ...]


def paired_strategies(kind: str, label: str, config: str) -> bool:
    """An `analyze(only=...)` filter for a quick look at a layer's space.

    Transformer layers come as pairs of blocks (attention in/out, MLP in/out). Within a pair
    the first block splits M (batch) or N (columns) and the second M or K (rows): data
    parallel, Megatron's column-then-row split and their mixes. A GPT layer's 81
    configurations become 16; segments of one block, and boundaries between them, are kept
    whole where they can be reached.
    """
    del label

    def role(name: str) -> str:
        return name.rsplit(",", maxsplit=1)[-1].split("@", maxsplit=1)[0]

    if kind == "segment":
        names = config.split(",")
        if len(names) < 2:
            return True
        return all(
            role(n) in (("M", "N") if i % 2 == 0 else ("M", "K")) for i, n in enumerate(names)
        )
    last, first = config.split("->")
    return (last == "none" or role(last) in ("M", "K")) and (
        first == "none" or role(first) in ("M", "N")
    )


def counting(
    only: Callable[[str, str, str], bool] | None,
) -> tuple[Callable[[str, str, str], bool], list[int]]:
    """Wrap an `only` filter so the programs it accepts are counted (for the progress bar)."""
    accepted = [0]

    def wrapped(kind: str, label: str, config: str) -> bool:
        keep = True if only is None else only(kind, label, config)
        accepted[0] += int(keep)
        return keep

    return wrapped, accepted


def describe(value: Any) -> str:
    return getattr(value, "__name__", repr(value))
