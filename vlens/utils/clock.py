"""How long this process has run: what a command's "done in ... s" should match (wall time, start-up included)."""

from __future__ import annotations

import os
import time

_IMPORTED = time.monotonic()  # fallback origin: when vlens's helpers were first imported


def seconds_since_process_start() -> float:
    """Wall-clock seconds since the process started (the interpreter's start-up and imports included).

    Read from /proc on Linux (the process's start time in clock ticks since boot against the system's
    uptime); elsewhere, or if /proc is unreadable, the time since this module was first imported.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of proc(5), counted after "(comm)"
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
        if uptime >= started:
            return uptime - started
    except (OSError, ValueError, IndexError):
        pass
    return time.monotonic() - _IMPORTED


__all__ = ["seconds_since_process_start"]
