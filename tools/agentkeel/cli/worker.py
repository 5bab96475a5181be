"""`agentkeel worker`: run a registry's handlers on the tasks it claims."""

from __future__ import annotations

from datetime import timedelta

import click

from agentkeel.cli.app import dsn_option, fail, main, require_dsn
from agentkeel.exitcodes import ExitCode
from agentkeel.preflight import connect as connect_dsn
from agentkeel.preflight import require_schema


@main.command(short_help="Run handlers on claimed tasks (the worker runtime).")
@dsn_option
@click.option(
    "--app",
    "app",
    required=True,
    metavar="MODULE:REGISTRY",
    help="The agentkeel.worker.Registry to run, as module:attribute (or file.py:attribute); "
    "the current directory is importable.",
)
@click.option(
    "--concurrency",
    default=4,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Tasks run at once, each in a thread of its own (and one database connection).",
)
@click.option(
    "--workflow",
    "workflows",
    multiple=True,
    metavar="NAME",
    help="Only tasks of this workflow (repeatable); by default every workflow of the registry.",
)
@click.option(
    "--lease",
    default=30.0,
    show_default=True,
    type=click.FloatRange(1),
    help="Seconds a lease lasts; it is renewed every third of that while the handler runs.",
)
@click.option(
    "--poll-interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.01),
    help="Seconds between claims when nothing was due.",
)
@click.option(
    "--shutdown-timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds running handlers may take to finish after SIGTERM / Ctrl-C; then their "
    "leases are given back (the tasks are due again at once).",
)
@click.option(
    "--progress-interval",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0.1),
    help="Seconds between progress lines.",
)
@click.option("--name", default=None, metavar="NAME", help="The lease owner (default host:pid).")
@click.option(
    "--log-format",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    help="json: one object per line on stderr.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def worker(
    dsn: str | None,
    app: str,
    concurrency: int,
    workflows: tuple[str, ...],
    lease: float,
    poll_interval: float,
    shutdown_timeout: float,
    progress_interval: float,
    name: str | None,
    log_format: str,
    log_level: str,
) -> None:
    """Claim due tasks of the registry's workflows in batches, run each with its handler,
    renew its lease while it runs, and write each outcome as a guarded transition: the
    state it returns or moved to, a retry with backoff after an exception, its failed
    state after the handler's max_attempts. SIGTERM / Ctrl-C stop claiming and let running
    handlers finish (--shutdown-timeout), then give the other leases back; a second signal
    gives them back at once. Needs a login in keel_worker. Checkpoints use the key in
    $AGENTKEEL_CHECKPOINT_KEY when it is set. Guide: docs/worker.md."""
    import logging
    import os
    import sys
    import threading

    from agentkeel.checkpoints import DEFAULT_KEY_VARIABLE, EnvKeyProvider
    from agentkeel.logs import configure
    from agentkeel.worker import Config, ConfigError, load_registry, run_worker
    from agentkeel.worker.registry import AppNotFound
    from agentkeel.worker.runtime import LOGGER, LoginRefused
    from agentkeel.worker.tracing import flush_tracing

    try:
        registry = load_registry(app)
    except AppNotFound as e:
        fail(str(e), ExitCode.USAGE)
    with connect_dsn(require_dsn(dsn), application_name="agentkeel-worker") as conn:
        require_schema(conn)
    config = Config(
        dsn=require_dsn(dsn),
        concurrency=concurrency,
        lease=timedelta(seconds=lease),
        poll_interval=poll_interval,
        shutdown_timeout=shutdown_timeout,
        progress_interval=progress_interval,
        workflows=workflows,
        key_provider=EnvKeyProvider() if os.environ.get(DEFAULT_KEY_VARIABLE) else None,
    )
    if name:
        config.name = name
    logger = configure(log_level, LOGGER, json_lines=log_format == "json")
    try:
        run_worker(config, registry, logger)
        main_thread = threading.main_thread()
        if any(
            t.is_alive() and not t.daemon and t is not main_thread for t in threading.enumerate()
        ):
            # A handler's executor thread (asyncio.to_thread) stuck in a provider call
            # would hold the exit; every lease is given back or ended by now. The exit
            # handlers would wait for it too: flush what they would have.
            flush_tracing()
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    except ConfigError as e:
        fail(str(e), ExitCode.REFUSED)
    except LoginRefused as e:
        fail(str(e), ExitCode.PERMISSION)
