"""Two sides of a probe, each in a fresh interpreter, alternating: for what a process keeps once
it has it (loaded kernels, a frozen heap), which one process cannot measure both ways."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def alternate(
    script: str, args: Sequence[str], names: Sequence[str], repeat: int, show: Callable[[dict[str, Any]], str]
) -> dict[str, list[dict[str, Any]]]:
    """Run ``script *args --side=NAME`` for each of ``names``, ``repeat`` rounds; each run prints
    a JSON object as its last line.  Prints ``show(object)`` per run; returns the objects by
    side.  A failed run ends the program with its standard error."""
    got: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(repeat):
        for name in names:
            res = subprocess.run(
                [sys.executable, script, *args, f"--side={name}"], cwd=ROOT, capture_output=True, text=True
            )
            if res.returncode:
                sys.exit(res.stderr[-3000:])
            d = json.loads(res.stdout.strip().splitlines()[-1])
            got[name].append(d)
            print(f"run {r + 1} {name}: {show(d)}", flush=True)
    return got
