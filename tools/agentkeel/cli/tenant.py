"""`agentkeel tenant delete`: delete a tenant (G10), in bounded steps, resumable;
`agentkeel tenant quota`: a tenant's quotas and what it holds of them (G9)."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import click
from rich.progress import Progress

from agentkeel.cli.app import dsn_option, err, fail, format_option, main, out, require_dsn
from agentkeel.exitcodes import ExitCode
from agentkeel.preflight import connect as connect_dsn
from agentkeel.preflight import require_schema
from agentkeel.target import cleanup_on_sigterm


@main.group(short_help="Tenant administration: quotas (G9), deletion (G10).")
def tenant() -> None:
    """Tenant administration, as the owner (a keel_migrator login)."""


@tenant.command("delete", short_help="Delete a tenant: its keys first, then its rows.")
@dsn_option
@click.argument("tenant_id", type=click.UUID, metavar="TENANT")
@click.option(
    "--events",
    type=click.Choice(["tombstone", "remove"]),
    default="tombstone",
    show_default=True,
    help="tombstone: keep each task event without its payload (who, when, which "
    "transition) in keel.task_event_tombstones; remove: keep nothing of them.",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Rows removed per step; each step is one short transaction.",
)
@click.option(
    "--keyring",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    metavar="DIR",
    help="The checkpoint keyring (KeyringKeyProvider) the workers use: the tenant's wrapping "
    "key in it is destroyed once the deletion has begun, so no backup taken before can be "
    "read either.",
)
@click.option("--dry-run", is_flag=True, help="Count the tenant's rows per table; remove none.")
@click.option(
    "--yes", is_flag=True, help="Do not ask for confirmation (needed without a terminal)."
)
@format_option(json_help="one object: the rows per table, and the deletion's outcome")
def tenant_delete(
    dsn: str | None,
    tenant_id: uuid.UUID,
    events: str,
    batch: int,
    keyring: Path | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """Delete TENANT and everything it owns, per the --events policy. The first step
    destroys its data keys (its checkpoint payloads are unreadable from then on) and marks
    it deleting: every API call for it is refused (55K17) from then on, and its id is never
    a tenant again. Then bounded steps remove its rows, children first; an interrupted run
    is resumed by running the command again. Needs the owner (a keel_migrator login)."""
    from agentkeel.checkpoints import KeyringKeyProvider
    from agentkeel.tenant_deletion import delete_tenant, tenant_rows, wrapping_key_ids

    keys = None
    if keyring is not None:
        try:
            keys = KeyringKeyProvider(keyring, create=False)
        except ValueError as refused:
            fail(f"--keyring: {refused}", ExitCode.USAGE)
    shredded: list[bool] = []
    with cleanup_on_sigterm(), connect_dsn(require_dsn(dsn)) as conn:
        require_schema(conn)
        rows = tenant_rows(conn, tenant_id)
        total = sum(rows.values())
        if keys is not None:
            others = sorted(wrapping_key_ids(conn, tenant_id) - {keys.key_id})
            if others:
                fail(
                    f"the tenant's data keys were wrapped by {', '.join(others)}, not by the "
                    f"keyring at {keyring} ({keys.key_id}): name the keyring the workers use",
                    ExitCode.REFUSED,
                )
        if dry_run:
            if as_json:
                click.echo(json.dumps({"tenant_id": str(tenant_id), "rows": rows}))
            else:
                for relation, count in rows.items():
                    out.print(f"{relation:<28} {count:>12,}", markup=False)
                out.print(f"{total:,} row(s) would be removed (--dry-run)", markup=False)
            return
        if not yes:
            if not sys.stdin.isatty():
                fail("`agentkeel tenant delete` deletes for good: pass --yes", ExitCode.USAGE)
            click.confirm(
                f"Delete tenant {tenant_id} ({total:,} rows) for good?", abort=True, err=True
            )
        with Progress(console=err, transient=True, disable=as_json or not err.is_terminal) as bar:
            task = bar.add_task("deleting", total=max(total, 1))
            deletion = delete_tenant(
                conn,
                tenant_id,
                "tombstone" if events == "tombstone" else "remove",
                batch,
                progress=lambda n: bar.advance(task, n),
                begun=None
                if keys is None
                else lambda: shredded.append(keys.destroy_tenant(tenant_id)),
            )
    if as_json:
        report = deletion.as_json()
        if keys is not None:
            report["keyring_key_destroyed"] = bool(shredded and shredded[0])
        click.echo(json.dumps(report))
        return
    for relation, count in deletion.removed.items():
        out.print(f"{relation:<28} {count:>12,} removed", markup=False)
    out.print(
        f"tenant {tenant_id} deleted: {sum(deletion.removed.values()):,} row(s) removed by this "
        f"run, {deletion.data_keys_destroyed} data key(s) destroyed, "
        f"{deletion.tombstones} event tombstone(s) kept",
        markup=False,
    )
    if keys is not None:
        state = "destroyed" if shredded and shredded[0] else "not in the keyring (none to destroy)"
        out.print(f"keyring key of tenant {tenant_id}: {state}", markup=False)


def _quota_change(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> dict[str, int | None]:
    """--set SETTING=N and --unset SETTING, as one dict of changes (None: remove)."""
    from agentkeel.quotas import SETTINGS

    changes: dict[str, int | None] = {}
    for value in values:
        setting, _, number = value.partition("=")
        if setting not in SETTINGS:
            raise click.BadParameter(f"{setting!r} is not one of {', '.join(SETTINGS)}")
        if param.name == "unset":
            changes[setting] = None
            continue
        if not number.isdigit():
            raise click.BadParameter(f"{value!r}: expected SETTING=N, N a whole number")
        changes[setting] = int(number)
    return changes


@tenant.command("quota", short_help="A tenant's quotas, what it holds of them; set its own.")
@dsn_option
@click.argument("tenant_id", type=click.UUID, metavar="TENANT")
@click.option(
    "--set",
    "set_",
    multiple=True,
    metavar="SETTING=N",
    callback=_quota_change,
    help="Give the tenant its own limit (repeatable): max_tenant_pending_messages, "
    "max_tenant_sessions, max_tenant_checkpoint_bytes, max_task_checkpoints, "
    "max_task_step_attempts.",
)
@click.option(
    "--unset",
    multiple=True,
    metavar="SETTING",
    callback=_quota_change,
    help="Remove the tenant's own limit (repeatable): the one for every tenant applies again.",
)
@format_option(json_help="one object: every quota with its limit, source and use")
def tenant_quota(
    dsn: str | None,
    tenant_id: uuid.UUID,
    set_: dict[str, int | None],
    unset: dict[str, int | None],
    as_json: bool,
) -> None:
    """Show TENANT's quotas: each limit, whether it is the tenant's own or the one for every
    tenant (keel.settings), and what the tenant holds of it. With --set or --unset, change
    its own limits first, in one transaction. Needs the owner (a keel_migrator login)."""
    from agentkeel.quotas import quota_status, set_quotas

    changes = {**set_, **unset}
    with connect_dsn(require_dsn(dsn)) as conn:
        require_schema(conn)
        quotas = quota_status(conn, tenant_id)  # an unknown tenant is refused before any change
        if changes:
            set_quotas(conn, tenant_id, changes)
            quotas = quota_status(conn, tenant_id)
    if as_json:
        click.echo(
            json.dumps({"tenant_id": str(tenant_id), "quotas": [q.as_json() for q in quotas]})
        )
        return
    for q in quotas:
        used = f"{q.used:,}" if q.used is not None else "(per task)"
        source = "own" if q.own else "default"
        out.print(f"{q.setting:<30} {used:>16} of {q.quota:>20,}  {source}", markup=False)
