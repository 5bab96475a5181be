"""The relay's settle step: a claim lost meanwhile (the lease ran out and another relay
took the message over), or a message deleted meanwhile, is refused by the database and
skipped; the batch's other acks stand. And the subject a topic makes on NATS."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
import pytest

from agentkeel.client import set_tenant_context
from agentkeel.relay import Config, Relay
from agentkeel.relay.sinks import ACK, StdoutSink, subject_for
from relay_services import Outbox


def test_a_lost_claim_is_skipped_and_the_other_acks_stand(migrated_db):
    box = Outbox.make(migrated_db)
    sent = box.commit("lost.claim", [1, 2, 3])

    async def scenario() -> tuple[Relay, str]:
        relay = Relay(
            Config(
                dsn=migrated_db,
                name="slow-relay",
                lease=timedelta(milliseconds=200),
                handle_signals=False,
            ),
            StdoutSink(),
        )
        relay.conn = await relay.connect()
        try:
            messages = await relay.claim()
            assert sorted(str(m.message_id) for m in messages) == sorted(sent)
            await asyncio.sleep(0.5)  # the claims expire; another relay takes one over
            async with await psycopg.AsyncConnection.connect(migrated_db, autocommit=True) as other:
                cur = await other.execute(
                    "select message_id from keel.claim_outbox('fast-relay', 1, '1 minute')"
                )
                row = await cur.fetchone()
                assert row is not None
            await relay.settle(messages, [ACK] * len(messages), 1)
        finally:
            await relay.conn.close()
        return relay, str(row[0])

    relay, taken = asyncio.run(scenario())
    assert (relay.stats.acked, relay.stats.claims_lost) == (2, 1)
    rows = {str(r["message_id"]): r for r in box.rows()}
    assert rows[taken]["state"] == "pending" and rows[taken]["claimed_by"] == "fast-relay"
    assert all(rows[m]["state"] == "delivered" for m in sent if m != taken)


@pytest.mark.parametrize("others", [0, 2], ids=["alone", "in_a_batch"])
def test_a_message_deleted_under_its_claim_is_counted_and_the_other_acks_stand(migrated_db, others):
    """The owner deletes a claimed message (its task, by cascade) before the relay acks it:
    its ack is refused (message_not_found), counted and logged, and the batch's other acks
    stand, whether it is acked alone (keel.ack_outbox) or in a batch."""
    box = Outbox.make(migrated_db)
    [gone] = box.commit("gone.claim", [1])
    kept = box.commit("gone.claim", list(range(others))) if others else []

    async def scenario() -> Relay:
        relay = Relay(Config(dsn=migrated_db, name="r", handle_signals=False), StdoutSink())
        relay.conn = await relay.connect()
        try:
            messages = await relay.claim()
            assert sorted(str(m.message_id) for m in messages) == sorted([gone, *kept])
            with psycopg.connect(migrated_db, autocommit=True) as su, su.transaction():
                set_tenant_context(su, box.tenant)
                su.execute("set local keel.purge = on")
                su.execute(
                    "delete from keel.tasks where tenant_id = %s and task_id ="
                    " (select task_id from keel.outbox where message_id = %s)",
                    (box.tenant, gone),
                )
            await relay.settle(messages, [ACK] * len(messages), 1)
        finally:
            await relay.conn.close()
        return relay

    relay = asyncio.run(scenario())
    assert (relay.stats.acked, relay.stats.claims_lost) == (others, 1)
    assert {str(r["message_id"]): r["state"] for r in box.rows()} == dict.fromkeys(
        kept, "delivered"
    )


@pytest.mark.parametrize(
    ("topic", "subject"),
    [
        ("orders.created", "keel.orders.created"),
        ("a:b/c-d_e", "keel.a:b/c-d_e"),
        ("a..b", None),
        ("trailing.", None),
    ],
)
def test_the_subject_of_a_topic(topic, subject):
    assert subject_for("keel", topic) == subject
