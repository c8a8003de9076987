"""``tidewatch dashboard``: run the Streamlit app on ``settings.dashboard_host:dashboard_port``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

APP = Path(__file__).with_name("app.py")


def streamlit_command(host: str, port: int, headless: bool = True) -> list[str]:
    """The command line that serves the dashboard (also used by ``tidewatch up`` and the tests)."""
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.address",
        host,
        "--server.port",
        str(port),
        "--server.headless",
        "true" if headless else "false",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
        "--client.toolbarMode",
        "viewer",
    ]


def register(app: typer.Typer) -> None:
    @app.command("dashboard")
    def dashboard(
        host: Annotated[
            str | None, typer.Option(help="address to bind (default: settings.dashboard_host)")
        ] = None,
        port: Annotated[int | None, typer.Option(help="port (default: settings.dashboard_port)")] = None,
    ) -> None:
        """Serve the Streamlit dashboard (PostgreSQL at settings.sqlalchemy_url must be up)."""
        from tidewatch.settings import get_settings

        s = get_settings()
        cmd = streamlit_command(host or s.dashboard_host, port or s.dashboard_port)
        typer.echo(f"dashboard on http://{host or s.dashboard_host}:{port or s.dashboard_port}")
        raise typer.Exit(subprocess.call(cmd, env=dict(os.environ)))
