"""`make explore` opens the explorer: the command its recipe runs starts JupyterLab on
127.0.0.1 with a token, prints the notebook's URL, and serves notebooks/explore.ipynb.

The test runs the recipe's command with this interpreter (not `make`, whose `setup` would
build a virtual environment), on a free port, and always stops the server.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("jupyterlab", reason="the ui extra is not installed")

ROOT = Path(__file__).resolve().parents[1]
START_S = 90


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _recipe(target: str) -> list[str]:
    """The command lines of a Makefile target's recipe."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def test_make_explore_runs_the_lab_launcher_and_make_plan_the_planner() -> None:
    assert _recipe("explore") == ["$(PY) -m explorer.ui.lab $(EXPLORE_ARGS)"]
    assert any("-m explorer plan" in line for line in _recipe("plan")), _recipe("plan")
    assert "setup" in (ROOT / "Makefile").read_text().split("explore:", 1)[1].splitlines()[0]


@pytest.mark.slow
def test_make_explore_serves_the_notebook_on_localhost_with_a_token(tmp_path: Path) -> None:
    port = _free_port()
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
    )
    env.pop("EXPLORER_TOKEN", None)
    log_path = tmp_path / "lab.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "explorer.ui.lab", f"--port={port}", "--no-browser"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + START_S
            url = None
            while url is None:
                found = re.search(
                    rf"{re.escape(base)}/lab/tree/notebooks/explore\.ipynb\?token=(\w+)",
                    log_path.read_text(),
                )
                if found:
                    url, token = found.group(0), found.group(1)
                elif server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"no URL printed by make explore's command:\n{log_path.read_text()}"
                    )
                else:
                    time.sleep(0.2)
            assert len(token) >= 32, f"a guessable token: {token!r}"
            contents = f"{base}/api/contents/notebooks/explore.ipynb"
            while True:
                try:
                    with urllib.request.urlopen(f"{contents}?token={token}", timeout=5) as reply:
                        served = json.load(reply)
                    break
                except (urllib.error.URLError, ConnectionError) as err:
                    if isinstance(err, urllib.error.HTTPError) or server.poll() is not None:
                        raise AssertionError(f"{err}\n{log_path.read_text()}") from err
                    if time.monotonic() > deadline:
                        pytest.fail(
                            f"JupyterLab did not answer in {START_S} s:\n{log_path.read_text()}"
                        )
                    time.sleep(0.5)
            assert served["type"] == "notebook" and served["name"] == "explore.ipynb"
            sources = ["".join(c["source"]) for c in served["content"]["cells"]]
            assert any("Explorer(" in s for s in sources), sources
            # the lab page for the printed URL is served too; without the token, nothing is
            with urllib.request.urlopen(url, timeout=10) as reply:
                assert reply.status == 200
            with pytest.raises(urllib.error.HTTPError) as denied:
                urllib.request.urlopen(contents, timeout=5)
            denied.value.close()
            assert denied.value.code == 403
            # JupyterLab itself reports serving on 127.0.0.1 (the launcher's --ip)
            assert f"http://127.0.0.1:{port}/" in log_path.read_text()
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(timeout=20)
