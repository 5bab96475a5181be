"""Issue 13's acceptance, at a size CI can afford: messages committed by concurrent
transitions while a relay to NATS JetStream is SIGKILLed every second and restarted. The
stream holds exactly one copy of each message, and an inbox consumer applies each exactly
once (and, fed everything again, nothing more).

$AGENTKEEL_RELAY_ACCEPTANCE_MESSAGES sets the size (default 1000; the issue asks for 10,000:
`AGENTKEEL_RELAY_ACCEPTANCE_MESSAGES=10000 .venv/bin/pytest -s tests/test_relay_acceptance.py`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter

import psycopg
from psycopg.types.json import Jsonb

from agentkeel.client import Keel
from relay_services import Outbox, any_nats, start_relay, stream, stream_messages

MESSAGES = int(os.environ.get("AGENTKEEL_RELAY_ACCEPTANCE_MESSAGES", "1000"))
PRODUCERS = 4
PER_TRANSITION = 10
KILL_EVERY = 1.0  # seconds
MAX_LIFE = 16.0  # seconds: the longest a relay lives between kills on a busy machine
STUCK_ROUNDS = 10  # rounds in a row without one delivery: the relay is stuck, not slow


def test_a_relay_killed_every_second_delivers_each_message_once_to_jetstream(migrated_db, tmp_path):
    box = Outbox.make(migrated_db)
    topic = "acceptance.order"
    # A kill spends no attempt (attempts are failed deliveries): with the default limits,
    # nothing may go dead however often the relay is killed.
    committed: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def produce(share: range) -> None:
        try:
            with psycopg.connect(migrated_db, autocommit=True) as conn:
                for start in share[::PER_TRANSITION]:
                    payloads = [
                        {"n": n} for n in range(start, min(start + PER_TRANSITION, share.stop))
                    ]
                    sent = box.commit(topic, payloads, conn)
                    with lock:
                        committed.extend(sent)
        except BaseException as error:
            errors.append(error)
            raise

    per = -(-MESSAGES // PRODUCERS)
    shares = [range(i * per, min((i + 1) * per, MESSAGES)) for i in range(PRODUCERS)]
    with any_nats(tmp_path / "nats") as url, stream(url) as (name, prefix):
        started = time.monotonic()
        producers = [threading.Thread(target=produce, args=(s,)) for s in shares]
        for p in producers:
            p.start()
        kills = 0
        # No deadline on the machine's speed: the run fails only when the relay makes no
        # progress at all for STUCK_ROUNDS rounds in a row. A round without progress (a
        # relay killed before it claimed anything, on a busy machine) doubles the next
        # relay's life, up to MAX_LIFE; progress brings it back to KILL_EVERY.
        life, idle_rounds, delivered = KILL_EVERY, 0, 0
        while True:
            relay = start_relay(
                migrated_db,
                f"{url}/{prefix}",
                "--batch",
                "100",
                "--concurrency",
                "16",
                "--lease",
                "2",
                "--poll-interval",
                "0.2",
                "--log-level",
                "warning",
            )
            time.sleep(life)
            relay.send_signal(signal.SIGKILL)
            relay.communicate(timeout=30)
            kills += 1
            states = box.states()
            done = not any(p.is_alive() for p in producers)
            if done and states == {"delivered": MESSAGES}:
                break
            if states.get("delivered", 0) > delivered:
                life, idle_rounds, delivered = KILL_EVERY, 0, states["delivered"]
            else:
                life, idle_rounds = min(life * 2, MAX_LIFE), idle_rounds + 1
            assert idle_rounds < STUCK_ROUNDS, f"no progress in {STUCK_ROUNDS} rounds: {states}"
            if kills % 30 == 0:  # a long run says how far it is
                print(f"relay acceptance: {kills} kills, {states}", flush=True)
        elapsed = time.monotonic() - started
        for p in producers:
            p.join()
        assert not errors
        held = stream_messages(url, name)

    assert len(committed) == MESSAGES
    copies = Counter(msg_id for msg_id, _ in held)
    assert copies == Counter(committed), "the stream must hold exactly one copy of each"
    rows = box.rows()
    assert all(r["attempts"] == 0 for r in rows)
    reclaimed = sum(1 for r in rows if r["claims"] > 1)
    # commit to delivery (delivered_at - created_at, the transaction's start), in seconds
    latency = sorted((r["delivered_at"] - r["created_at"]).total_seconds() for r in rows)
    p50, p99 = latency[len(latency) // 2], latency[int(len(latency) * 0.99)]

    # The consumer: inbox_accept and the effect in one transaction, for every message the
    # stream holds, twice over (the second pass is a full redelivery).
    applied = 0
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        keel = Keel(conn)
        for _ in range(2):
            for msg_id, body in held:
                with keel.transaction(box.tenant):
                    accepted = conn.execute(
                        "select keel.inbox_accept(%s, 'acceptance', %s)", (box.tenant, msg_id)
                    ).fetchone()
                    if accepted and accepted[0]:
                        conn.execute(
                            "select keel.create_task(%s, %s, 1, p_metadata => %s)",
                            (box.tenant, box.workflow, Jsonb({"applied": body["message_id"]})),
                        )
                        applied += 1
        with keel.transaction(box.tenant):
            effects = conn.execute(
                "select metadata->>'applied' from keel.tasks where tenant_id = %s"
                " and metadata ? 'applied'",
                (box.tenant,),
            ).fetchall()
    assert applied == MESSAGES
    assert Counter(r[0] for r in effects) == Counter(committed)
    print(
        f"\nacceptance: {MESSAGES} messages, {PRODUCERS} producers, relay SIGKILLed {kills} "
        f"times (every {KILL_EVERY}s), drained in {elapsed:.1f}s; {reclaimed} messages claimed "
        f"more than once; commit to delivery p50 {p50:.2f}s, p99 {p99:.2f}s; stream holds "
        f"{len(held)} (one each); inbox applied {applied}"
    )
