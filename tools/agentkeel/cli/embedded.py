"""`agentkeel embedded`: a throwaway, migrated PostgreSQL until Ctrl-C."""

from __future__ import annotations

import os
import signal
import sys
import time

from agentkeel.cli.app import (
    err,
    fail,
    main,
    out,
)
from agentkeel.exitcodes import ExitCode
from agentkeel.target import embedded_database


@main.command(short_help="Start a throwaway PostgreSQL and print its DSN.")
def embedded() -> None:
    """Start a throwaway, migrated PostgreSQL, print its DSN, and remove it on Ctrl-C."""
    # Started in the background by a non-interactive shell (`agentkeel embedded &` in a
    # script), a process inherits SIGINT ignored, and Ctrl-C or `kill -INT` would never
    # remove the cluster.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with embedded_database() as target:  # SIGTERM: KeyboardInterrupt too (target.py)
            # The DSN alone on stdout (`dsn=$(agentkeel embedded | head -1)`); how to use it
            # and how to stop it on stderr, written first: whoever reads the DSN and stops
            # the cluster at once must not cut the hint off.
            err.print(
                f"agentkeel: a migrated throwaway PostgreSQL is running; use it with\n"
                f"  export AGENTKEEL_DSN='{target}'\n"
                f"Ctrl-C (or kill -INT / kill -TERM {os.getpid()}) stops it and removes its data.",
                markup=False,
            )
            sys.stderr.flush()
            out.print(target, markup=False)
            sys.stdout.flush()
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        fail("interrupted: the embedded cluster was stopped and removed", ExitCode.INTERRUPTED)
