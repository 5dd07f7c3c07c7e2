"""The app's controls: every widget a user sets or clicks, built in one place.

`Controls` only makes the widgets and reads them back (`_settings`); what a change does is
wired in `app.py`, and what is drawn in `present.py`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from explorer import models
from explorer.errors import ExplorerError
from explorer.ui.graph import ROLE_FILTERS
from explorer.ui.inputs import presets
from explorer.ui.state import Session, Settings

AUTO = {"width": "auto", "flex": "0 0 auto"}  # buttons keep their label's width
WIDE = {"description_width": "initial"}


def mesh_shapes(devices: int) -> list[tuple[int, ...]]:
    """Every 1-D and 2-D factorisation of `devices` (axes of size 1 left out)."""
    shapes: list[tuple[int, ...]] = [(devices,)]
    shapes += [(a, devices // a) for a in range(2, devices) if devices % a == 0]
    return shapes


class Controls:
    """The widgets (attributes ending in `_w`, and the labels beside them)."""

    session: Session

    def _build_controls(self, settings: Settings, devices: int, export_path: str | Path) -> None:
        from explorer.platforms import list_platforms

        self.model_w = widgets.Dropdown(
            options=sorted(models.MODELS), value=settings.model, description="model"
        )
        self.model_w.add_class("explorer-model")
        self.preset_w = widgets.Dropdown(
            options=presets(settings.model), value=settings.preset, description="preset"
        )
        self.preset_w.add_class("explorer-preset")
        self.layers_w = widgets.BoundedIntText(
            value=settings.layers or 0, min=0, max=512, description="layers (0: preset)",
            style=WIDE, layout={"width": "170px"},
        )  # fmt: skip
        self.devices_w = widgets.Dropdown(
            options=list(range(1, devices + 1)),
            value=math.prod(settings.mesh),
            description="devices",
            layout={"width": "150px"},
        )
        self.mesh_w = widgets.Dropdown(description="mesh", layout={"width": "170px"})
        self.mesh_w.add_class("explorer-mesh")
        self._mesh_options(self.devices_w.value, settings.mesh)
        self.platform_w = widgets.Dropdown(
            options=list_platforms(), value=settings.platform, description="platform"
        )
        self.backend_w = widgets.Dropdown(
            options=["compiled", "measured"], value=settings.backend, description="backend",
            layout={"width": "200px"},
        )  # fmt: skip
        self.quick_w = widgets.Checkbox(
            value=settings.quick, description="quick look (paired strategies only)", indent=False
        )
        self.run_w = widgets.Button(
            description="Profile and solve", button_style="primary", icon="play", layout=AUTO
        )
        self.run_w.add_class("explorer-run")
        self.cancel_w = widgets.Button(
            description="Cancel", icon="stop", disabled=True, layout=AUTO,
            tooltip="stop profiling; the programs already profiled stay in the cache",
        )  # fmt: skip
        self.cancel_w.add_class("explorer-cancel")
        self.progress_w = widgets.IntProgress(value=0, min=0, max=1, description="profiling")
        self.progress_label = widgets.Label("")
        self.progress_label.add_class("explorer-progress")
        self.summary_w = widgets.HTML("<i>Press “Profile and solve”.</i>")
        self.summary_w.add_class("explorer-summary")
        # one slider step per frontier plan: every position is a plan, none is rounded
        self.budget_w = widgets.IntSlider(
            value=0, min=0, max=0, step=1, description="memory budget", readout=False,
            continuous_update=True, style=WIDE, disabled=True,
            layout={"width": "420px", "max_width": "100%"},
        )  # fmt: skip
        self.budget_w.add_class("explorer-budget")
        self.budget_label = widgets.HTML("", layout={"min_width": "300px"})
        self.budget_label.add_class("explorer-budget-label")
        self.fastest_w = widgets.Button(
            description="no budget (fastest)", disabled=True, layout=AUTO
        )
        self.fit_w = widgets.Button(
            description="Compile to check it fits", icon="check", disabled=True, layout=AUTO,
            tooltip="compile the whole step under the plan shown; where it needs more memory "
            "than the budget (the device's memory without one), find the fastest plan whose "
            "compiled step fits and show it",
        )  # fmt: skip
        self.fit_w.add_class("explorer-check-fit")
        self.fit_label = widgets.HTML("")
        self.fit_label.add_class("explorer-fit-label")
        self.uniform_w = widgets.Checkbox(
            value=False, description="one configuration per segment type", indent=False
        )
        self.segment_w = widgets.Dropdown(description="segment", options=[])
        self.level_w = widgets.ToggleButtons(options=["blocks", "ops"], value="blocks")
        self.roles_w = widgets.ToggleButtons(options=list(ROLE_FILTERS), value="all")
        self.search_w = widgets.Text(
            value="", placeholder="op id, primitive or scope", description="find ops",
            continuous_update=False, layout={"width": "280px"},
        )  # fmt: skip
        self.search_w.add_class("explorer-search")
        self.collapse_w = widgets.SelectMultiple(
            options=[], description="collapse", rows=3, style=WIDE,
            layout={"width": "320px"},
        )  # fmt: skip
        self.bars_filter_w = widgets.Text(
            value="", placeholder="e.g. K@x (the plan's always shown)",
            description="configurations", continuous_update=False, style=WIDE,
            layout={"width": "360px"},
        )  # fmt: skip
        self.bars_filter_w.add_class("explorer-bars-filter")
        self.pin_block_w = widgets.Dropdown(description="pin block", options=[], style=WIDE)
        self.pin_block_w.add_class("explorer-pin-block")
        self.pin_strategy_w = widgets.Dropdown(description="strategy", options=[])
        self.pin_strategy_w.add_class("explorer-pin-strategy")
        self.pin_w = widgets.Button(description="Pin and re-solve", icon="thumb-tack", layout=AUTO)
        self.pin_w.add_class("explorer-pin")
        self.unpin_w = widgets.Button(description="Clear pins")
        self.pins_label = widgets.HTML("no pins")
        self.baselines_w = widgets.Button(
            description="Compute baselines", icon="table", layout=AUTO
        )
        self.baseline_table = widgets.HTML("")
        self.export_path_w = widgets.Text(value=str(export_path), description="export to")
        self.export_w = widgets.Button(
            description="Export plan", icon="download", disabled=True, layout=AUTO
        )
        self.export_w.add_class("explorer-export")
        self.download_w = widgets.HTML("")

    def _settings(self) -> Settings:
        mesh = self.mesh_w.value
        if mesh is None:
            raise ExplorerError("choose a mesh shape")
        return Settings(
            model=self.model_w.value,
            preset=self.preset_w.value,
            layers=self.layers_w.value or None,
            mesh=tuple(mesh),
            platform=self.platform_w.value,
            backend=self.backend_w.value,
            quick=self.quick_w.value,
        )

    def _mesh_options(self, devices: int, wanted: tuple[int, ...] | None = None) -> None:
        shapes = mesh_shapes(devices)
        self.mesh_w.options = [("x".join(map(str, m)), m) for m in shapes]
        self.mesh_w.value = wanted if wanted in shapes else shapes[0]

    def _pin_strategies(self) -> None:
        analysis = self.session.analysis
        block = self.pin_block_w.value
        if analysis is None or block is None:
            self.pin_strategy_w.options = []
            return
        names = [s.name for s in analysis.blocks[block].strategies]
        self.pin_strategy_w.options = names
        if names:
            self.pin_strategy_w.value = names[0]

    def _setting_controls(self) -> tuple[Any, ...]:
        """The controls a run is made of: changing one makes a refused argument moot."""
        return (
            self.model_w, self.preset_w, self.layers_w, self.devices_w, self.mesh_w,
            self.platform_w, self.backend_w,
        )  # fmt: skip
