"""The explorer in a real browser: JupyterLab on 127.0.0.1, driven by Playwright with the
system Chromium (never a downloaded browser).

JupyterLab serves a temporary copy of notebooks/ with this interpreter's kernel; the test runs
every cell from the Run menu, moves the budget slider with the keyboard, checks the plan
summary changed, clicks Export and checks the file was written and holds the plan shown (its
time in the summary, its strategy per block in the summary's details), then saves a
screenshot of the app to assets/explorer.png. The notebook shares the test session's profile cache
(helpers.SHARED_CACHE) on purpose: the cold run is test_notebook's job.

Without Chromium the test skips locally, but fails under CI (`CI` set, as `.ci/run` does).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import SHARED_CACHE

from explorer import load_plan

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path(os.environ.get("EXPLORER_CHROMIUM", "/usr/bin/chromium"))
SCREENSHOT = ROOT / "assets" / "explorer.png"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SERVER_START_S = 90
RUN_ALL_S = 420  # profiling (warm or cold) and one sharded step
STEP_S = 30


def _require(condition: bool, reason: str) -> None:
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the browser test must run)")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A JupyterLab server on a copy of notebooks/; yields (base url with token, root)."""
    root = tmp_path / "notebooks"
    shutil.copytree(ROOT / "notebooks", root)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        EXPLORER_CACHE=str(SHARED_CACHE),
        EXPLORER_PLAN=str(root / "plan.json"),
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "jupyter-runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "lab-settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "lab-workspaces"),
    )
    log = (tmp_path / "lab.log").open("w")
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        "--LabApp.news_url=", "--LabApp.extension_manager=readonly",
    ]  # fmt: skip
    if os.geteuid() == 0:  # CI containers run as root
        command.append("--allow-root")
    server = subprocess.Popen(
        command,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5):
                    break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    pytest.fail(f"JupyterLab did not start:\n{(tmp_path / 'lab.log').read_text()}")
                time.sleep(0.5)
        yield f"{base}/lab/tree/explore.ipynb?token={token}", root
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=20)
        log.close()


def _dismiss(page: Any, timeout_ms: int) -> None:
    """Answer JupyterLab's first-run questions: keep the notebook's kernel, no news."""
    select = page.get_by_role("button", name="Select Kernel")
    try:
        select.wait_for(timeout=timeout_ms)
    except Exception:  # no dialog: the kernel started by itself
        pass
    else:
        select.click()
    news = page.get_by_role("button", name="No", exact=True)
    if news.count():
        news.first.click()


@pytest.mark.slow
@pytest.mark.browser
def test_the_explorer_in_jupyterlab(lab: tuple[str, Path], tmp_path: Path) -> None:
    _require(CHROMIUM.is_file(), f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _require(False, "the playwright package is not installed (test extra)")
        raise
    url, root = lab
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 2300})
        page.set_default_timeout(STEP_S * 1000)
        try:
            page.goto(url)
            page.locator(".jp-NotebookPanel").first.wait_for()
            _dismiss(page, 10_000)
            expect(page.get_by_text("Python 3 (ipykernel) | Idle")).to_be_visible(
                timeout=SERVER_START_S * 1000
            )
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            _dismiss(page, 2_000)
            # run-all ends with the sharded step's loss
            expect(page.get_by_text("one step of the cfp plan on mesh 8 (x): loss")).to_be_visible(
                timeout=RUN_ALL_S * 1000
            )
            app = page.locator(".explorer-app")
            summary = app.locator(".explorer-summary")
            expect(summary).to_contain_text("ms/step")
            before = summary.inner_text()

            handle = app.locator(".explorer-budget .noUi-handle")
            handle.focus()
            for _ in range(20):  # keyboard steps until the budget crosses a frontier point
                page.keyboard.press("PageDown")
                page.wait_for_timeout(300)
                if summary.inner_text() != before:
                    break
            after = summary.inner_text()
            assert after != before, f"the plan summary did not change: {after}"
            assert "ms/step" in after or "No plan" in after

            plan = root / "plan.json"
            plan.unlink(missing_ok=True)
            app.locator(".explorer-export").first.click()
            deadline = time.monotonic() + STEP_S
            while not plan.is_file() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert plan.is_file(), app.locator(".explorer-message").inner_text()
            expect(app.locator("a.explorer-download")).to_be_visible()
            message = app.locator(".explorer-message").inner_text()
            assert "failed" not in message, message
            # what is exported is what is shown: the same time and the same strategies
            exported = load_plan(plan)
            shown = summary.inner_text()
            assert f"{1e3 * exported.time:.4f} ms/step" in shown, (shown, exported.time)
            strategies = app.locator(".explorer-strategies").text_content() or ""
            listed = ", ".join(f"{b}: {n}" for b, n in enumerate(exported.strategies) if n)
            assert strategies.removeprefix("strategy per block") == listed, strategies

            SCREENSHOT.parent.mkdir(exist_ok=True)
            app.screenshot(path=str(SCREENSHOT))
            assert SCREENSHOT.stat().st_size > 10_000
        except BaseException:
            page.screenshot(path=str(tmp_path / "failure.png"))
            print(f"screenshot of the failure: {tmp_path / 'failure.png'}")
            raise
        finally:
            browser.close()
