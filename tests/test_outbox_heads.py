"""Migration 0036 on an install that already holds pending keyed messages: run as a
migrator login that is not a superuser (row-level security forced on the outbox), it
keeps the oldest message of each key claimable and holds the rest, and counts each key's
pending messages, so per-key order holds across the upgrade."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta

import psycopg
from psycopg import conninfo, sql

from agentkeel.client import Keel, set_tenant_context
from agentkeel.sql_files import sql_root

MIGRATION = "schema/0036_outbox_key_heads.sql"


def backfill() -> str:
    """The migration's DO block, as the file holds it."""
    text = (sql_root() / MIGRATION).read_text()
    match = re.search(r"^do \$\$.*?^\$\$;", text, re.S | re.M)
    assert match, f"{MIGRATION} has no DO block"
    return match.group(0)


def test_the_upgrade_holds_all_but_the_oldest_pending_message_of_each_key(migrated_db):
    a, b = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(migrated_db, autocommit=True) as su:
        keel = Keel(su)
        keel.create_tenant("heads-a", a)
        keel.create_tenant("heads-b", b)
        rows = [  # (tenant, key, state, minutes ago)
            (a, "k", "pending", 9),
            (a, "k", "pending", 8),
            (a, "k", "delivered", 10),
            (a, "k", "pending", 7),
            (a, "j", "pending", 5),
            (b, "k", "pending", 4),
            (b, "k", "pending", 3),
            (b, None, "pending", 2),
        ]
        made: dict[tuple[uuid.UUID, str | None, int], uuid.UUID] = {}
        for tenant, key, state, ago in rows:
            with su.transaction():
                set_tenant_context(su, tenant)
                [message_id] = su.execute(
                    "insert into keel.outbox (tenant_id, topic, message_key, payload, state,"
                    " delivered_at, created_at, held)"
                    " values (%s, 'heads.t', %s, '{}', %s,"
                    " case when %s = 'delivered' then now() end, now() - %s, false)"
                    " returning message_id",
                    (tenant, key, state, state, timedelta(minutes=ago)),
                ).fetchone()
            made[(tenant, key, ago)] = message_id
        migrator = f"akt_heads_{uuid.uuid4().hex[:8]}"
        su.execute(
            sql.SQL("create role {} login in role keel_owner").format(sql.Identifier(migrator))
        )
    try:
        with psycopg.connect(conninfo.make_conninfo(migrated_db, user=migrator)) as conn:
            assert conn.execute(
                "select rolsuper from pg_roles where rolname = current_user"
            ).fetchone() == (False,)
            conn.execute(backfill())
            conn.commit()
        with psycopg.connect(migrated_db, autocommit=True) as su:
            held = dict(
                su.execute(
                    "select message_id, held from keel.outbox where tenant_id in (%s, %s)", (a, b)
                ).fetchall()
            )
            counts = set(
                su.execute(
                    "select tenant_id, message_key, pending from keel.outbox_keys"
                    " where tenant_id in (%s, %s)",
                    (a, b),
                ).fetchall()
            )
            claimed = {
                r[0]
                for r in su.execute(
                    "select message_id from keel.claim_outbox('heads', 100, '1 minute', 'heads.')"
                )
            }
    finally:
        with psycopg.connect(migrated_db, autocommit=True) as su:
            su.execute(sql.SQL("drop role {}").format(sql.Identifier(migrator)))
    assert {key: held[m] for key, m in made.items()} == {
        (a, "k", 9): False,
        (a, "k", 8): True,
        (a, "k", 10): False,  # delivered: not pending, never held
        (a, "k", 7): True,
        (a, "j", 5): False,
        (b, "k", 4): False,
        (b, "k", 3): True,
        (b, None, 2): False,
    }
    assert counts == {(a, "k", 3), (a, "j", 1), (b, "k", 2)}
    assert claimed == {made[(a, "k", 9)], made[(a, "j", 5)], made[(b, "k", 4)], made[(b, None, 2)]}


def test_a_held_message_that_leaves_does_not_make_a_second_head(migrated_db):
    """A message claimed before migration 0036 can be held by it while the oldest message of
    its key stays pending: its ack must not promote another one while that head is pending.
    Fails without the head check in keel.outbox_key_leave (two claimable messages of a
    key)."""
    tenant = uuid.uuid4()
    with psycopg.connect(migrated_db, autocommit=True) as su:
        Keel(su).create_tenant("heads-c", tenant)
        ids = []
        with su.transaction():
            set_tenant_context(su, tenant)
            for ago, held in ((9, False), (8, True), (7, True)):
                [message_id] = su.execute(
                    "insert into keel.outbox (tenant_id, topic, message_key, payload, created_at,"
                    " held) values (%s, 'heads.c', 'k', '{}', now() - %s, %s)"
                    " returning message_id",
                    (tenant, timedelta(minutes=ago), held),
                ).fetchone()
                ids.append(message_id)
            su.execute(
                "insert into keel.outbox_keys (tenant_id, message_key, pending)"
                " values (%s, 'k', 3)",
                (tenant,),
            )
            # the middle one is in flight, as a claim taken under the old rule leaves it
            su.execute(
                "update keel.outbox set claimed_by = 'old-relay', claim_token = 42, claims = 1,"
                " available_at = now() + interval '1 hour' where message_id = %s",
                (ids[1],),
            )
        su.execute("select keel.ack_outbox(%s, %s, 42)", (tenant, ids[1]))

        def claimable() -> list[uuid.UUID]:
            return [
                r[0]
                for r in su.execute(
                    "select message_id from keel.outbox where tenant_id = %s"
                    " and state = 'pending' and not held order by created_at",
                    (tenant,),
                )
            ]

        assert claimable() == [ids[0]]
        [(token,)] = su.execute(
            "select claim_token from keel.claim_outbox('new-relay', 10, '1 minute', 'heads.c')"
        ).fetchall()
        su.execute("select keel.ack_outbox(%s, %s, %s)", (tenant, ids[0], token))
        assert claimable() == [ids[2]]
        assert su.execute(
            "select pending from keel.outbox_keys where tenant_id = %s", (tenant,)
        ).fetchall() == [(1,)]
