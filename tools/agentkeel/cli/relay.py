"""`agentkeel relay`: deliver the outbox; `relay status`, `relay dead list|replay`."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from agentkeel.cli.app import (
    dsn_option,
    fail,
    format_option,
    main,
    out,
    require_dsn,
)
from agentkeel.exitcodes import ExitCode
from agentkeel.preflight import connect as connect_dsn
from agentkeel.preflight import require_schema


@main.group(
    invoke_without_command=True,
    short_help="Deliver the outbox to NATS JetStream, HTTP, a file or stdout.",
)
@dsn_option
@click.option(
    "--sink",
    metavar="URL",
    default=None,
    help="nats://host:port/subject.prefix, http(s)://..., file:PATH, or - (stdout). Required.",
)
@click.option(
    "--batch",
    default=100,
    show_default=True,
    type=click.IntRange(1),
    help="Messages per claim; at most the database's settings.max_batch_items (1000 by "
    "default), to which a larger one is lowered.",
)
@click.option(
    "--concurrency",
    default=32,
    show_default=True,
    type=click.IntRange(1, 1000),
    help="Publishes in flight at once within a batch.",
)
@click.option(
    "--lease",
    default=30.0,
    show_default=True,
    type=click.FloatRange(0.001),
    help="Seconds a claim lasts; keep it longer than a batch takes to publish.",
)
@click.option(
    "--poll-interval",
    default=1.0,
    show_default=True,
    type=click.FloatRange(0.01),
    help="Seconds between claims when no NOTIFY arrives.",
)
@click.option(
    "--wake-cooldown",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0),
    help="Least seconds between an empty claim and the next, however many NOTIFYs arrive.",
)
@click.option(
    "--timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0.01),
    help="Seconds a publish (NATS, HTTP) may take before it counts as failed.",
)
@click.option(
    "--db-timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0.1),
    help="Seconds a database call may take before the connection is dropped and remade.",
)
@click.option(
    "--status-interval",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds between status lines (delivered, retried, dead, pending, lag); 0: none.",
)
@click.option(
    "--once",
    is_flag=True,
    help="Deliver what is due, then exit 0; exit 6 if the sink cannot be reached.",
)
@click.option("--no-listen", is_flag=True, help="Poll only (no LISTEN keel_outbox).")
@click.option(
    "--topic-prefix",
    default=None,
    metavar="PREFIX",
    help="Deliver only topics starting with PREFIX.",
)
@click.option(
    "--name",
    default=None,
    metavar="NAME",
    help="This relay's name in keel.outbox.claimed_by (default host:pid).",
)
@click.option(
    "--no-prepare",
    is_flag=True,
    help="No prepared statements (PgBouncer in transaction mode before 1.21).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
@click.pass_context
def relay(
    ctx: click.Context,
    dsn: str | None,
    sink: str | None,
    batch: int,
    concurrency: int,
    lease: float,
    poll_interval: float,
    wake_cooldown: float,
    timeout: float,
    db_timeout: float,
    status_interval: float,
    once: bool,
    no_listen: bool,
    topic_prefix: str | None,
    name: str | None,
    no_prepare: bool,
    log_level: str,
) -> None:
    """Deliver outbox messages at least once: claim a batch (lease + fencing token), publish
    it, ack each message only after the sink confirmed it. SIGTERM / Ctrl-C finish the
    publishes in flight, ack them, release the other claims and exit 0. Logs are JSON lines
    on stderr. `agentkeel relay status` shows the outbox per topic. Guide: docs/relay.md."""
    if ctx.invoked_subcommand is not None:
        return
    import asyncio
    from datetime import timedelta

    from agentkeel.logs import configure
    from agentkeel.relay import Config, Failpoints, parse_sink, run
    from agentkeel.relay.loop import LOGGER

    if not sink:
        fail(
            "`agentkeel relay` needs --sink URL (nats://, http(s)://, file:PATH or -)",
            ExitCode.USAGE,
        )
    target = parse_sink(sink, timeout=timeout)
    failpoints = Failpoints()
    # The same refusals as every command (a bad option value is usage, exit 2; unreachable
    # is exit 6), before the relay's own asynchronous connection.
    connect_dsn(require_dsn(dsn), application_name="agentkeel-relay").close()
    config = Config(
        dsn=require_dsn(dsn),
        batch=batch,
        concurrency=concurrency,
        lease=timedelta(seconds=lease),
        poll_interval=poll_interval,
        wake_cooldown=wake_cooldown,
        once=once,
        listen=not no_listen,
        topic_prefix=topic_prefix,
        prepare=not no_prepare,
        db_timeout=db_timeout,
        status_interval=status_interval,
    )
    if name:
        config.name = name
    configure(log_level, LOGGER)
    asyncio.run(run(config, target, failpoints))


@relay.command("status")
@dsn_option
@format_option(json_help="one object per topic")
def relay_status(dsn: str | None, as_json: bool) -> None:
    """Pending, in flight, dead, the oldest pending age, and what was delivered in the last
    minute and hour, per topic."""
    from agentkeel.relay.status import age_text, read_status

    with connect_dsn(require_dsn(dsn)) as conn:
        require_schema(conn)
        topics = read_status(conn)
    if as_json:
        click.echo(json.dumps({"topics": [t.as_json() for t in topics]}, indent=2))
        return
    table = Table(
        "topic",
        "pending",
        "in flight",
        "dead",
        "oldest pending",
        "delivered 1 min",
        "delivered 1 h",
        "per s",
        title="outbox",
    )
    for t in topics:
        table.add_row(
            t.topic,
            str(t.pending),
            str(t.in_flight),
            f"[bold red]{t.dead}[/]" if t.dead else "0",
            age_text(t.oldest_pending_age),
            f"{t.delivered_last_minute:,}",
            f"{t.delivered_last_hour:,}",
            f"{t.per_second:,.1f}",
        )
    out.print(table)
    if not topics:
        out.print("the outbox is empty")


@relay.group("dead")
def relay_dead() -> None:
    """List or replay dead messages of every tenant (a keel_relay login; no payloads)."""


def _dead_filter(tenant: str | None, topic: str | None, ids: tuple[str, ...]) -> Any:
    import uuid

    from agentkeel.relay.dead import Filter

    def parse(value: str, what: str) -> uuid.UUID:
        try:
            return uuid.UUID(value)
        except ValueError:
            fail(f"{what} {value!r} is not a uuid", ExitCode.USAGE)

    return Filter(
        tenant=None if tenant is None else parse(tenant, "--tenant"),
        topic=topic,
        ids=tuple(parse(i, "--id") for i in ids),
    )


dead_filters = [
    click.option("--tenant", default=None, metavar="UUID", help="Only this tenant's."),
    click.option("--topic", default=None, metavar="TOPIC", help="Only this topic's."),
    click.option("--id", "ids", multiple=True, metavar="UUID", help="Only this message (repeat)."),
]


def with_dead_filters(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(dead_filters):
        command = option(command)
    return command


@relay_dead.command("list")
@dsn_option
@with_dead_filters
@click.option("--limit", default=100, show_default=True, type=click.IntRange(1), help="At most.")
@format_option(json_help="one object per message")
def relay_dead_list(
    dsn: str | None,
    tenant: str | None,
    topic: str | None,
    ids: tuple[str, ...],
    limit: int,
    as_json: bool,
) -> None:
    """Dead messages, oldest death first: tenant, id, topic, attempts, claims, last error."""
    from agentkeel.relay.dead import dead_messages

    where = _dead_filter(tenant, topic, ids)
    with connect_dsn(require_dsn(dsn)) as conn:
        require_schema(conn)
        found = list(dead_messages(conn, where, limit))
    if as_json:
        click.echo(json.dumps({"dead": [m.as_json() for m in found]}, indent=2))
        return
    table = Table("dead at", "tenant", "message", "topic", "attempts", "claims", "last error")
    for m in found:
        table.add_row(
            m.dead_at.isoformat(timespec="seconds"),
            str(m.tenant_id),
            str(m.message_id),
            m.topic,
            str(m.attempts),
            str(m.claims),
            (m.last_error or "")[:120],
        )
    out.print(table)
    out.print(
        f"{len(found)} dead message(s)" + (f" (--limit {limit})" if len(found) == limit else "")
    )


@relay_dead.command("replay")
@dsn_option
@with_dead_filters
@click.option("--all", "everything", is_flag=True, help="Every dead message (no filter).")
@click.option("--dry-run", is_flag=True, help="Say what would be replayed; change nothing.")
@format_option(json_help="what was replayed, as JSON")
def relay_dead_replay(
    dsn: str | None,
    tenant: str | None,
    topic: str | None,
    ids: tuple[str, ...],
    everything: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Put dead messages back to pending under the same ids (attempts and claims 0), each
    in its own transaction. Needs --tenant, --topic, --id or --all."""
    from agentkeel.relay.dead import dead_messages, replay

    where = _dead_filter(tenant, topic, ids)
    if where.empty != everything:
        fail(
            "name what to replay with --tenant, --topic or --id, or pass --all (not both)",
            ExitCode.USAGE,
        )
    replayed: list[str] = []
    skipped = 0
    with connect_dsn(require_dsn(dsn)) as conn:
        require_schema(conn)
        found = list(dead_messages(conn, where))
        for m in found:
            if dry_run or replay(conn, m):
                replayed.append(str(m.message_id))
            else:
                skipped += 1
    if as_json:
        document = {"dry_run": dry_run, "replayed": replayed, "no_longer_dead": skipped}
        click.echo(json.dumps(document, indent=2))
        return
    verb = "would replay" if dry_run else "replayed"
    out.print(
        f"{verb} {len(replayed)} dead message(s)"
        + (f"; {skipped} no longer dead" if skipped else "")
    )
