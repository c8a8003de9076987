"""Where the embedded stack's logs are, said in one line (under ``tidewatch status``'s table)."""

from __future__ import annotations

import os

__all__ = ["log_line"]


def log_line(rows: list[dict[str, str]]) -> str:
    """Where the components' logs are, in one line under the status table (the paths made the
    table wrap at 80 columns): ``logs: <dir>/<component>.log`` for the components whose log is
    named for them in the folder most of them share, then the path of each other one."""
    logs = {r["name"]: r["log"] for r in rows if r["log"] != "-"}
    if not logs:
        return "logs: none yet"
    named = [(os.path.dirname(p), n) for n, p in logs.items() if os.path.basename(p) == f"{n}.log"]
    folders = [d for d, _ in named]
    common = max(set(folders), key=folders.count) if folders else None
    pattern = [n for d, n in named if d == common]
    parts = [f"{common or '.'}/<component>.log"] if len(pattern) > 1 else []
    parts += [f"{n} {p}" for n, p in logs.items() if len(pattern) <= 1 or n not in pattern]
    return "logs: " + "; ".join(parts)
