"""``tests/sigterm_plugin.py``: a test session stopped by SIGTERM tears its fixtures down (what
stops the services a killed CI run would otherwise leave running). No services."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tidewatch.settings import PROJECT_ROOT

CASE = """
import time
from pathlib import Path

import pytest

@pytest.fixture
def service():
    yield
    Path({done!r}).write_text("torn down")

def test_runs_until_stopped(service):
    Path({ready!r}).write_text("running")
    time.sleep(120)
"""


def test_sigterm_tears_the_fixtures_down(tmp_path: Path) -> None:
    ready, done = tmp_path / "ready", tmp_path / "done"
    case = tmp_path / "case" / "test_case.py"
    case.parent.mkdir()
    case.write_text(CASE.format(ready=str(ready), done=str(done)))
    env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT)}
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "tests.sigterm_plugin",
        str(case),
    ]
    proc = subprocess.Popen(argv, cwd=case.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert ready.exists(), proc.communicate(timeout=10)[0].decode(errors="replace")
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0].decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
    assert done.read_text() == "torn down", out  # the fixture's teardown ran
    assert proc.returncode == 2, out  # pytest's "interrupted"
