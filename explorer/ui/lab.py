"""`make explore`: JupyterLab on notebooks/explore.ipynb, on 127.0.0.1 with a token.

    python -m explorer.ui.lab [--port N] [--no-browser]

The command prints the URL to open (with its token) and then becomes the JupyterLab server
(`os.execv`), so Ctrl-C and `kill` reach the server itself. JAX gets 8 virtual CPU devices
unless XLA_FLAGS already says otherwise.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = Path("notebooks") / "explore.ipynb"
HOST = "127.0.0.1"
DEFAULT_PORT = 8888
PORT_TRIES = 50


def free_port(start: int = DEFAULT_PORT, tries: int = PORT_TRIES) -> int:
    """The first port from `start` that nothing listens on at 127.0.0.1."""
    for port in range(start, start + tries):
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
            return port
    raise SystemExit(
        f"explore: no free port on {HOST} in {start}..{start + tries - 1}; pass one with --port"
    )


def lab_command(port: int, token: str, *, browser: bool = True) -> list[str]:
    """The JupyterLab command `make explore` runs (the test starts the same one)."""
    command = [
        sys.executable, "-m", "jupyterlab", str(NOTEBOOK),
        f"--ip={HOST}", f"--port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={ROOT}",
        "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]  # fmt: skip
    if not browser:
        command.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # containers run as root
        command.append("--allow-root")
    return command


def notebook_url(port: int, token: str) -> str:
    return f"http://{HOST}:{port}/lab/tree/{NOTEBOOK.as_posix()}?token={token}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="make explore", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=None, help="default: first free from 8888")
    parser.add_argument("--no-browser", action="store_true", help="only print the URL")
    args = parser.parse_args(argv)
    port = args.port if args.port is not None else free_port()
    token = os.environ.get("EXPLORER_TOKEN") or secrets.token_hex(24)
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    print(f"The plan explorer is starting at\n\n    {notebook_url(port, token)}\n", flush=True)
    print("Open that URL (it carries the token); Ctrl-C stops the server.\n", flush=True)
    command = lab_command(port, token, browser=not args.no_browser)
    os.chdir(ROOT)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
