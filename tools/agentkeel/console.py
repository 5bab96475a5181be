"""The CLI's consoles: the terminal's width on a terminal, full width anywhere else.

rich cuts tables to 80 columns when the output is not a terminal (a CI log, a pipe, a
file), which turned `schema/0013_task_events_claimed_actor.sql` into `schema/0013_task_…`.
Where nobody reads at a width, every cell is printed whole, one row per line.
"""

from __future__ import annotations

import sys
from typing import IO

from rich.console import Console

# Wide enough that no table cell is ever folded; rich sizes a table to its content.
PLAIN_WIDTH = 10_000


def make_console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console for stdout (or stderr, or file): the terminal's width on a terminal,
    else PLAIN_WIDTH ($COLUMNS describes a terminal, and some runners set it to 80 for
    output that goes to a log)."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    on_terminal = hasattr(stream, "isatty") and stream.isatty()
    return Console(
        stderr=stderr,
        file=file,
        highlight=False,
        soft_wrap=True,
        width=None if on_terminal else PLAIN_WIDTH,
    )
