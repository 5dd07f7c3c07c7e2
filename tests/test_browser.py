"""The explorer in a real browser: JupyterLab on 127.0.0.1, driven by Playwright with the
system Chromium (never a downloaded browser), as a user would:

run all cells; move the budget slider with the keyboard (timing key press to redrawn figures)
and by dragging its handle; pin a block; explain the plan; export and check the file holds the
plan shown (its time in the summary, its strategy per block in the summary's details); change
the mesh 8 -> 2x4 and run, cancel that run once programs are profiled and run again from the
cache; switch the model to MoE and run; export again and check again. Screenshots of the app
go to assets/explorer.png and assets/explorer-why.png. The notebook shares the test session's
profile cache (helpers.SHARED_CACHE) on purpose: the cold run is test_notebook's job.

Without Chromium the test skips locally, but fails under CI (`CI` set, as `.ci/run` does).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import statistics
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
SCREENSHOT_WHY = ROOT / "assets" / "explorer-why.png"
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
RUN_S = 600  # a run from the app (a new mesh or model: cold programs on 2 shared cores)
STEP_S = 30
KEY_PRESSES = 6  # slider steps timed from key press to the last figure redrawn
QUIET_MS = 400  # a redraw is over when no figure changed for this long


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
        page = browser.new_page(viewport={"width": 1500, "height": 4200})
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

            delays = _keyboard_steps(page, app, summary)
            print(
                f"slider by keyboard, key press to redrawn figures: {len(delays)} steps, median "
                f"{statistics.median(delays):.0f} ms, max {max(delays):.0f} ms "
                f"({', '.join(f'{d:.0f}' for d in delays)})"
            )
            _drag_slider(page, app, summary)

            # pin the layer's second block (attention out) to the other strategy the quick
            # look profiles for it (the second block of a pair splits M or K)
            strategies = _shown_strategies(app)
            block = 1
            pin_to = "K@x" if strategies[block] != "K@x" else "M@x"
            app.locator(".explorer-pin-block select").select_option(
                index=sorted(strategies).index(block)
            )
            app.locator(".explorer-pin-strategy select").select_option(label=pin_to)
            app.locator(".explorer-pin").click()
            expect(summary).to_contain_text(f"pins: block {block}: {pin_to}")
            assert _shown_strategies(app)[block] == pin_to
            _no_failure(app)

            app.locator(".explorer-explain").click()
            status = app.locator(".explorer-explain-status")
            expect(status).to_contain_text("explained", timeout=RUN_S * 1000)
            expect(app.locator(".explorer-collectives")).to_be_visible()
            expect(app.locator(".explorer-counterfactuals")).to_be_visible()
            app.locator(".explorer-why").screenshot(path=str(SCREENSHOT_WHY))

            _export_matches_the_plan_shown(app, summary, root / "plan.json")
            _checked_compiled(app)
            SCREENSHOT.parent.mkdir(exist_ok=True)
            app.screenshot(path=str(SCREENSHOT))
            assert SCREENSHOT.stat().st_size > 10_000

            # mesh 8 -> 2x4; cancel the run once programs are profiled, then run again
            progress = app.locator(".explorer-progress")
            app.locator(".explorer-mesh select").select_option(label="2x4")
            app.locator(".explorer-run").click()
            page.wait_for_function(
                "() => /profiled [1-9]/.test(document.querySelector('.explorer-progress')"
                "?.textContent ?? '')",
                timeout=RUN_S * 1000,
            )
            app.locator(".explorer-cancel").click()
            expect(progress).to_contain_text("cancelled", timeout=RUN_S * 1000)
            cancelled = _number(r"cancelled: (\d+)", progress.inner_text())
            assert cancelled >= 1
            expect(summary).to_contain_text("mesh 8 (x)")  # the previous analysis, still shown
            app.locator(".explorer-run").click()
            expect(progress).to_contain_text("profiles from", timeout=RUN_S * 1000)
            cached = _number(r"\((\d+) from the cache", progress.inner_text())
            assert cached >= cancelled, progress.inner_text()
            expect(summary).to_contain_text("mesh 2x4 (x, y)")
            _no_failure(app)

            # the MoE model on the same mesh. The progress line still reads "profiles from"
            # the 2x4 run until the kernel has taken the click: wait for the new run's own line
            app.locator(".explorer-model select").select_option(label="moe")
            app.locator(".explorer-preset select").select_option(label="tiny")
            before = [progress.inner_text(), summary.inner_text()]
            app.locator(".explorer-run").click()
            page.wait_for_function(
                "([progress, summary]) => {"
                " const text = (c) => document.querySelector(c)?.textContent ?? '';"
                " const now = [text('.explorer-progress'), text('.explorer-summary')];"
                " return now[0] !== progress && now[0].includes('profiles from')"
                " && now[1] !== summary && now[1].includes('ms/step'); }",
                arg=before,
                timeout=RUN_S * 1000,
            )
            _no_failure(app)
            # the summary is drawn before the graph, bars and frontier, and the run holds the
            # app's lock until they are: its button comes back when the run is done
            expect(app.locator(".explorer-run")).to_be_enabled(timeout=RUN_S * 1000)
            shown = _shown_strategies(app)
            assert len(shown) > len(strategies), "the MoE step has more blocks than GPT's"
            app.screenshot(path=str(tmp_path / "moe.png"))
            print(f"the app on MoE: {tmp_path / 'moe.png'}")
            _export_matches_the_plan_shown(app, summary, root / "plan.json")
            _checked_compiled(app)
        except BaseException:
            page.screenshot(path=str(tmp_path / "failure.png"))
            print(f"screenshot of the failure: {tmp_path / 'failure.png'}")
            raise
        finally:
            browser.close()


def _keyboard_steps(page: Any, app: Any, summary: Any) -> list[float]:
    """Move the slider one step per key press; per step, ms from the keydown event to the
    last change of any figure (or the summary) before the page went quiet."""
    page.evaluate(
        """() => {
            const t = (window.__explorerTimes = {down: 0, last: 0});
            document.addEventListener('keydown', () => { t.down = performance.now(); }, true);
            const seen = new MutationObserver(() => { t.last = performance.now(); });
            for (const el of document.querySelectorAll(
                    '.explorer-app .js-plotly-plot, .explorer-summary')) {
                seen.observe(el, {subtree: true, childList: true, attributes: true,
                                  characterData: true});
            }
        }"""
    )
    handle = app.locator(".explorer-budget .noUi-handle")
    handle.focus()
    delays = []
    for step in range(KEY_PRESSES):
        before = summary.inner_text()
        # back and forth: every press is a step to another frontier plan, whatever their number
        page.keyboard.press("ArrowLeft" if step % 2 == 0 else "ArrowRight")
        for _ in range(40):
            page.wait_for_timeout(50)
            if summary.inner_text() != before:
                break
        while True:  # quiet: nothing redrawn for QUIET_MS
            times = page.evaluate("() => window.__explorerTimes")
            now = page.evaluate("() => performance.now()")
            if now - times["last"] > QUIET_MS:
                break
            page.wait_for_timeout(50)
        if summary.inner_text() != before:
            delays.append(times["last"] - times["down"])
    assert len(delays) == KEY_PRESSES, f"only {len(delays)} key presses changed the plan"
    return delays


def _drag_slider(page: Any, app: Any, summary: Any) -> None:
    """Drag the slider's handle to the far right: the fastest plan."""
    before = summary.inner_text()
    handle = app.locator(".explorer-budget .noUi-handle").bounding_box()
    track = app.locator(".explorer-budget .noUi-target").bounding_box()
    assert handle is not None and track is not None
    y = handle["y"] + handle["height"] / 2
    page.mouse.move(handle["x"] + handle["width"] / 2, y)
    page.mouse.down()
    page.mouse.move(track["x"] + track["width"] + 20, y, steps=8)
    page.mouse.up()
    expect_text = app.locator(".explorer-budget-label")
    page.wait_for_function(
        "() => /plan (\\d+) of \\1\\b/.test("
        "document.querySelector('.explorer-budget-label')?.textContent ?? '')",
        timeout=STEP_S * 1000,
    )
    assert summary.inner_text() != before, expect_text.inner_text()


def _shown_strategies(app: Any) -> dict[int, str]:
    text = app.locator(".explorer-strategies").text_content() or ""
    pairs = text.removeprefix("strategy per block").split(", ")
    return {int(b): n for b, n in (p.split(": ", 1) for p in pairs if p)}


def _no_failure(app: Any) -> None:
    message = app.locator(".explorer-message").inner_text()
    assert "failed" not in message and "refused" not in message, message


def _checked_compiled(app: Any) -> None:
    """The plan shown, compiled: it fits the budget, or the check shows one that does, or
    says that none compiled fits."""
    from playwright.sync_api import expect

    app.locator(".explorer-check-fit").click()
    expect(app.locator(".explorer-fit-label")).to_contain_text(
        re.compile(r"fits it compiled|plans compiled to find one that fits|no plan compiled fits"),
        timeout=RUN_S * 1000,
    )
    _no_failure(app)


def _export_matches_the_plan_shown(app: Any, summary: Any, plan: Path) -> None:
    """Export: the file holds the plan shown (same time, same strategy per block)."""
    plan.unlink(missing_ok=True)
    app.locator(".explorer-export").first.click()
    deadline = time.monotonic() + STEP_S
    while not plan.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert plan.is_file(), (
        f"no {plan.name} {STEP_S} s after the click; message: "
        f"{app.locator('.explorer-message').inner_text()!r}; export button enabled: "
        f"{app.locator('.explorer-export').first.is_enabled()}; progress: "
        f"{app.locator('.explorer-progress').inner_text()!r}"
    )
    print(f"export: click to file {STEP_S - (deadline - time.monotonic()):.1f} s")
    app.locator("a.explorer-download").wait_for()
    _no_failure(app)
    exported = load_plan(plan)
    shown = summary.inner_text()
    assert f"{1e3 * exported.time:.4f} ms/step" in shown, (shown, exported.time)
    listed = {b: n for b, n in enumerate(exported.strategies) if n}
    assert _shown_strategies(app) == listed


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in {text!r}"
    return int(found.group(1))
