"""Silence C-level stdout while a native solver starts.

An in-process HiGHS (``highspy``, also behind PuLP's ``HiGHS``) prints a banner on file
descriptor 1 before any option can be set; it would corrupt ``ecal ... --json`` output.
:func:`c_stdout_quiet` points descriptor 1 at ``/dev/null`` for the duration of a block.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def c_stdout_quiet(on: bool = True) -> Iterator[None]:
    """Point file descriptor 1 at /dev/null while the block runs (when ``on``); Python's own
    buffered stdout is flushed first, so nothing already printed is lost."""
    if not on:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
