"""The retention purge (G11) from the client: keel.purge for every tenant (or the ones
named), each in bounded steps of one short transaction, as `agentkeel purge` runs it once
or in a loop. What is due is decided in the database, by each tenant's retention periods
(keel.settings, keel.tenant_retention)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

TENANT_PAGE = 1000


@dataclass
class PurgeReport:
    """One round: the tenants it went through, and rows removed (or, in a dry run, due)
    per kind of retention and per table."""

    dry_run: bool
    tenants: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    by_relation: dict[str, int] = field(default_factory=dict)
    # Tenants whose purge the database refused, with its one-line error: the round goes on.
    failed: dict[str, str] = field(default_factory=dict)

    def add(self, kind: str, relation: str, count: int) -> None:
        self.by_kind[kind] = self.by_kind.get(kind, 0) + count
        self.by_relation[relation] = self.by_relation.get(relation, 0) + count

    @property
    def total(self) -> int:
        return sum(self.by_relation.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "tenants": self.tenants,
            "kinds": self.by_kind,
            "relations": self.by_relation,
            "failed": self.failed,
        }

    def describe(self) -> str:
        kinds = ", ".join(f"{k} {n:,}" for k, n in self.by_kind.items() if n)
        verb = "due (--dry-run)" if self.dry_run else "purged"
        head = f"{self.total:,} row(s) {verb} in {self.tenants:,} tenant(s)"
        return f"{head}: {kinds}" if kinds else head


def all_tenants(conn: psycopg.Connection) -> Iterator[uuid.UUID]:
    """Every tenant id, a page at a time (keel.purge_tenants), in id order."""
    after: uuid.UUID | None = None
    while True:
        with conn.transaction():
            page = [
                r[0]
                for r in conn.execute(
                    "select * from keel.purge_tenants(%s, %s)", (after, TENANT_PAGE)
                )
            ]
        yield from page
        if len(page) < TENANT_PAGE:
            return
        after = page[-1]


def purge_tenant(
    conn: psycopg.Connection, tenant: uuid.UUID, batch: int, dry_run: bool, report: PurgeReport
) -> None:
    """keel.purge for one tenant until a step removes fewer than batch rows (a dry run: once)."""
    while True:
        with conn.transaction():
            rows = conn.execute(
                "select kind, relation, removed from keel.purge(%s, %s, %s)",
                (tenant, batch, dry_run),
            ).fetchall()
        removed = 0
        for kind, relation, count in rows:
            report.add(str(kind), str(relation), int(count))
            removed += int(count)
        if dry_run or removed < batch:
            return


def purge_round(
    conn: psycopg.Connection,
    batch: int,
    tenants: Sequence[uuid.UUID] = (),
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
) -> PurgeReport:
    """One round over the named tenants, or all of them. Needs the owner (a keel_migrator
    login); progress(rows) after each tenant."""
    report = PurgeReport(dry_run)
    for tenant in tenants or all_tenants(conn):
        before = report.total
        try:
            purge_tenant(conn, tenant, batch, dry_run, report)
        except psycopg.Error as err:
            if err.sqlstate is None or err.sqlstate[:2] in ("08", "28", "42", "57"):
                raise  # the connection, the login or a privilege: no other tenant would fare better
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            report.failed[str(tenant)] = f"{err.sqlstate}: {first}"
        report.tenants += 1
        if progress is not None:
            progress(report.total - before)
    return report
