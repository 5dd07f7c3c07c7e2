"""The app's message area: every error and notice is shown there, never only in the log.

A run's standing notes (strategies a mesh excludes) stay above later messages until the next
run; a message is replaced by the next one, and cleared by a success that supersedes it.
"""

from __future__ import annotations

import functools
import html
import logging
import traceback
from collections.abc import Callable
from typing import Literal, ParamSpec, TypeVar

import ipywidgets as widgets

from explorer.errors import ExplorerError

log = logging.getLogger("explorer.ui")
P = ParamSpec("P")
R = TypeVar("R")

Kind = Literal["error", "info", "warning"]
COLOURS: dict[Kind, str] = {"error": "#B00020", "info": "#0B5394", "warning": "#8A5A00"}


class Messages:
    """The message area (`message_w`) and the helpers that write to it."""

    message_w: widgets.HTML
    _notes: list[str]
    _last: tuple[str, Kind]

    def _build_messages(self) -> None:
        self.message_w = widgets.HTML("", layout={"width": "100%"})
        self.message_w.add_class("explorer-message")
        self._notes = []  # warnings about the current run, shown until the next
        self._last = ("", "error")

    @property
    def message(self) -> str:
        return str(self.message_w.value)

    def _guard(self, fn: Callable[P, R], where: str) -> Callable[P, R | None]:
        """Run a callback; show its error in the message area instead of losing it."""

        @functools.wraps(fn)
        def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
            try:
                return fn(*args, **kwargs)
            except Exception as err:
                self._error(where, err)
                return None

        return guarded

    def _error(self, where: str, err: BaseException, after: str = "") -> None:
        """An error as a message: our own errors by their text, others with a traceback."""
        log.warning("explorer %s failed", where, exc_info=err)
        text = f"{type(err).__name__}: {err}"
        detail = (
            ""
            if isinstance(err, ExplorerError | ValueError)
            else "".join(traceback.format_exception(err)[-6:])
        )
        body = f"<b>{html.escape(where)} failed.</b> {html.escape(text)}{after}"
        if detail:
            body += (
                f"<details><summary>traceback</summary><pre>{html.escape(detail)}</pre></details>"
            )
        self._say(body, "error")

    def _say(self, body: str, kind: Kind = "error") -> None:
        """Show `body` (HTML) in the message area, after the run's standing notes."""
        self._last = (body, kind)
        parts: list[tuple[str, Kind]] = [(note, "warning") for note in self._notes]
        if body:
            parts.append((body, kind))
        self.message_w.value = "".join(
            f"<div class='explorer-{k}' style='border-left:4px solid {COLOURS[k]};"
            f"padding:4px 8px;margin:2px 0;color:{COLOURS[k]}'>{b}</div>"
            for b, k in parts
        )

    def _note(self, notes: list[str]) -> None:
        """Standing notes about the current run (kept above later messages)."""
        self._notes = notes
        self._say(*self._last)
