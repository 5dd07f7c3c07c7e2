"""The UI is an optional extra: importing the engine must not pull it in."""

import subprocess
import sys


def test_import_explorer_does_not_import_ui_packages() -> None:
    code = (
        "import sys, explorer\n"
        "loaded = [m for m in ('ipywidgets', 'plotly', 'anywidget') if m in sys.modules]\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "", f"import explorer loaded {result.stdout.strip()}"


def test_only_jax_compat_touches_jax_internals() -> None:
    from pathlib import Path

    import explorer

    root = Path(explorer.__file__).parent
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.name != "_jax_compat.py" and "jax._src" in path.read_text()
    ]
    assert offenders == []
