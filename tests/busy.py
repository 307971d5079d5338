"""Load beside a test: two CPU-burning child processes (the "busy loops" of the determinism
tests: the same input must give the same plan on a loaded machine)."""

from __future__ import annotations

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
