"""The notebook explorer (optional extra `ui`): ipywidgets and plotly views of an analysis.

Nothing outside this package imports it, so the engine runs without the UI dependencies.

    from explorer.ui import Explorer
    app = Explorer(model="gpt", preset="tiny", mesh=(8,))
    display(app); app.run()
"""

from explorer.ui.app import Explorer
from explorer.ui.controls import mesh_shapes
from explorer.ui.inputs import presets
from explorer.ui.state import Choice, Session, Settings, paired_strategies

__all__ = [
    "Choice",
    "Explorer",
    "Session",
    "Settings",
    "mesh_shapes",
    "paired_strategies",
    "presets",
]
