"""Processes around a test: load beside it (two CPU-burning children: the same input must give
the same plan on a loaded machine) and the children it leaves behind (Linux /proc)."""

from __future__ import annotations

import os
import subprocess
import sys

SPIN = "while True:\n    pass\n"


class BusyLoops:
    """Two child processes that spin until the block ends (killed by their own pids)."""

    def __enter__(self) -> BusyLoops:
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live (not zombie) children of ``pid``, from Linux /proc."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
            if int(fields[1]) != pid or fields[0] == b"Z":
                continue
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                out.append((int(d), fh.read().replace(b"\0", b" ").decode(errors="replace")))
        except (OSError, ValueError, IndexError):
            continue
    return out


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is neither a zombie nor dead (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            state = fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
