"""Fairness across tenants in the outbox claim (migration 0042, keel.outbox_tenants_due):
half of each claim is shared equally among the tenants with due messages, so one tenant's
flood does not stand in front of the others' messages; the rest of the batch is the oldest
due messages of any tenant, so the oldest due message is in every claim (of two or more)
and a claim comes back short only when nothing more is due."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

import citus_cluster
from agentkeel.checkpoints import uuid7
from agentkeel.client import Keel
from relay_services import Outbox

FLOOD = 3000
TUPLES = (
    "select coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)"
    " from pg_stat_xact_user_tables where relid = 'keel.outbox'::regclass"
)


@pytest.fixture(scope="module")
def citus_outbox_db(citus_admin_dsn: str) -> Iterator[str]:
    """One distributed database for this module's tests on the Citus cluster."""
    with citus_cluster.fresh_database(citus_admin_dsn) as dsn:
        citus_cluster.migrate_and_distribute(dsn)
        yield dsn


@pytest.fixture(params=["postgresql", pytest.param("citus", marks=pytest.mark.citus)])
def outbox_db(request: pytest.FixtureRequest) -> str:
    """A migrated database, and the same on the Citus cluster (its own claim variant)."""
    if request.param == "citus":
        return str(request.getfixturevalue("citus_outbox_db"))
    return str(request.getfixturevalue("migrated_db"))


def time_ordered_tenant(dsn: str) -> Outbox:
    """Outbox.make with a uuid v7 tenant id, as applications often make them."""
    made = Outbox.make(dsn)
    tenant = uuid7()
    with psycopg.connect(dsn, autocommit=True) as conn:
        Keel(conn).create_tenant("fair-v7", tenant)
    return Outbox(dsn, tenant, made.workflow)


def topic() -> str:
    return f"fair{uuid.uuid4().hex[:8]}"


def flood(ob: Outbox, name: str, count: int) -> None:
    """`count` keyless messages of one tenant, a thousand per transition (the cap)."""
    while count > 0:
        ob.commit(name, list(range(min(count, 1000))))
        count -= 1000


def claim(conn: psycopg.Connection, prefix: str, limit: int) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """(tenant, message) of each message one claim returns."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            "select tenant_id, message_id from keel.claim_outbox('fair', %s, '1 hour', %s)",
            (limit, prefix),
        )
    ]


def test_a_message_written_after_another_tenants_flood_is_in_the_next_claim(outbox_db):
    """Tenant A commits 3,000 messages, then B one. The next claim of 100 holds B's message
    and 99 of A's. Fails on a claim that serves strictly oldest first (B's message waits
    for 30 claims, behind all of A's)."""
    name = topic()
    a, b = Outbox.make(outbox_db), Outbox.make(outbox_db)
    flood(a, f"{name}.a", FLOOD)
    [late] = b.commit(f"{name}.b", [{"n": 1}])
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        got = claim(conn, f"{name}.", 100)
    assert len(got) == 100
    assert (b.tenant, uuid.UUID(late)) in got
    assert Counter(t for t, _ in got) == {a.tenant: 99, b.tenant: 1}


def test_each_tenant_with_due_messages_gets_an_equal_share_of_half_the_claim(outbox_db):
    """Three tenants with 3,000, 500 and 500 due messages: a claim of 90 gives each 15 (its
    share of 45) and the other 45 to the oldest messages, A's; the next claim again."""
    name = topic()
    tenants = [Outbox.make(outbox_db) for _ in range(3)]
    flood(tenants[0], f"{name}.a", FLOOD)
    for ob in tenants[1:]:
        ob.commit(f"{name}.x", list(range(500)))
    want = {tenants[0].tenant: 60, tenants[1].tenant: 15, tenants[2].tenant: 15}
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        assert Counter(t for t, _ in claim(conn, f"{name}.", 90)) == want
        assert Counter(t for t, _ in claim(conn, f"{name}.", 90)) == want


def test_shares_rounded_up_never_make_a_claim_larger_than_asked(outbox_db):
    """Three tenants with 50 due messages each and a claim of 100: shares of 17 of half the
    batch, and the oldest messages for the rest; the claim returns 100, at least 17 of each
    tenant's."""
    name = topic()
    tenants = [Outbox.make(outbox_db) for _ in range(3)]
    for ob in tenants:
        ob.commit(f"{name}.x", list(range(50)))
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        got = Counter(t for t, _ in claim(conn, f"{name}.", 100))
    assert sum(got.values()) == 100
    assert set(got) == {ob.tenant for ob in tenants} and min(got.values()) >= 17


def test_a_tenant_with_less_than_its_share_leaves_the_rest_to_the_others(outbox_db):
    """A has 3,000 messages, B 10: a claim of 100 returns all 10 of B's and 90 of A's, the
    rest of the batch filled oldest first, so the claim is full while anything is due."""
    name = topic()
    a, b = Outbox.make(outbox_db), Outbox.make(outbox_db)
    flood(a, f"{name}.a", FLOOD)
    b.commit(f"{name}.b", list(range(10)))
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        assert Counter(t for t, _ in claim(conn, f"{name}.", 100)) == {a.tenant: 90, b.tenant: 10}


def test_the_oldest_due_messages_are_in_every_claim_and_each_is_claimed_once(outbox_db):
    """Twelve tenants, made one after the other (their ids share their leading digits),
    write five messages each in a transition, the last tenant's first: claims of four
    take one message of each of two tenants and two of the oldest. Every claim holds a
    message of the oldest transition still pending (its messages share one available_at),
    however the tenants are ordered, and fifteen claims take all sixty, each once."""
    name = topic()
    tenants = [time_ordered_tenant(outbox_db) for _ in range(12)]
    written = [
        (ob.tenant, m)
        for ob in (tenants[-1], *tenants[:-1])
        for m in ob.commit(f"{name}.x", [1] * 5)
    ]
    seen: set[str] = set()
    with psycopg.connect(outbox_db, autocommit=True) as conn:
        for _ in range(15):
            oldest = next(t for t, m in written if m not in seen)
            got = claim(conn, f"{name}.", 4)
            assert len(got) == 4 and oldest in {t for t, _ in got}
            seen |= {str(m) for _, m in got}
        assert claim(conn, f"{name}.", 4) == []
    assert seen == {m for _, m in written}


def test_the_fair_share_reads_no_flood(migrated_db):
    """With 3,000 of A's messages due, a claim of 100 that serves A and B reads a few
    hundred outbox rows (the share and the rest of the batch), not A's flood."""
    name = topic()
    a, b = Outbox.make(migrated_db), Outbox.make(migrated_db)
    flood(a, f"{name}.a", FLOOD)
    b.commit(f"{name}.b", [{"n": 1}])
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute("analyze keel.outbox")
        with conn.transaction():
            before = conn.execute(TUPLES).fetchone()[0]
            assert len(claim(conn, f"{name}.", 100)) == 100
            read = conn.execute(TUPLES).fetchone()[0] - before
    assert read < 500, f"the claim read {read} outbox rows with {FLOOD} due"
