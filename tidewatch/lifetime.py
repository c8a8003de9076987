"""A child process that must not outlive its parent (base layer: any package may use it).

Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG)``) has the kernel SIGKILL the calling
process when the *thread* that created it ends -- the whole parent process included --, and is
kept across ``exec``.  Users: the apps ``tidewatch up`` runs under supervisord
(:mod:`tidewatch.stack.app_exec`) and the engine's forked snapshot writer
(:mod:`engine.runtime.snapshot_writer`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> bool:
    """Ask for SIGKILL when the creating thread of ``parent`` ends (Linux; elsewhere nothing), and
    say whether ``parent`` is still this process's parent -- False: it has ended already, before
    the request could cover it, and the caller should end now."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    return os.getppid() == parent
