"""``python -m tidewatch.stack.app_exec APP``: the command supervisord runs for an app of the stack
(and for the Spark master and workers of ``tidewatch up --workers N``).

It reads the settings the way every Tidewatch process does, builds the app's command line and
environment (:func:`tidewatch.stack.embedded.app_command`: its least-privilege database URL, in
the SCRAM modes its own Kafka password and blanks for every other principal's) and replaces
itself with the app (``os.execve``: supervisord's PID is the app's).  So supervisord.conf holds no
password, and a restart by supervisord gets the same environment as the first start.

On Linux the app is also killed (SIGKILL, ``prctl(PR_SET_PDEATHSIG)``, kept across the exec) when
supervisord dies without stopping it -- e.g. SIGKILLed --, so no app outlives the supervisor that
``tidewatch down`` stops.  SIGKILL, not SIGTERM: with supervisord gone an app's stdout is a broken
pipe, and a graceful stop can hang on it (Streamlit's SIGTERM handler did: it fails printing
"Stopping..."); the apps are built to survive a kill (docs/RELIABILITY.md, "Faults survived").
"""

from __future__ import annotations

import os
import sys

from tidewatch.lifetime import die_with_parent


def _die_with_parent(parent: int) -> None:
    """SIGKILL to this process when its parent ends; exit now if it has already (it is no longer
    ``parent``, the parent PID this process started with): :func:`tidewatch.lifetime.die_with_parent`."""
    if not die_with_parent(parent):
        sys.exit("supervisord is gone")


def main(argv: list[str] | None = None) -> None:
    parent = os.getppid()
    from tidewatch.settings import get_settings
    from tidewatch.stack import embedded

    args = sys.argv[1:] if argv is None else argv
    settings = get_settings()
    names = [a.name for a in embedded.all_apps(settings)]  # the apps, and the Spark cluster's daemons
    if len(args) != 1 or args[0] not in names:
        sys.exit(f"usage: python -m tidewatch.stack.app_exec {{{','.join(names)}}}")
    cmd, env = embedded.app_command(args[0], settings)
    _die_with_parent(parent)
    sys.stdout.flush()
    os.execve(cmd[0], cmd, env)


if __name__ == "__main__":
    main()
