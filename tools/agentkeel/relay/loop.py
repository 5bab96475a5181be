"""The relay: claim a batch of due outbox messages, publish them, ack or nack each (G6).

One batch is three steps, each its own transaction so that it works through PgBouncer in
transaction mode:

1. ``keel.claim_outbox`` commits a claim (lease + fencing token) on up to ``batch``
   messages of any tenant;
2. the sink publishes them, up to ``concurrency`` at a time, and confirms each;
3. one transaction acks the confirmed ones (``keel.ack_outbox``), nacks the failed ones
   (``keel.nack_outbox``: backoff or dead, decided in SQL) and releases the ones not sent
   because the relay is stopping (``keel.release_outbox``); a claim lost meanwhile (its
   lease ran out and another relay took the message) is logged and skipped.

A crash anywhere re-delivers at most the messages of the batch in hand, with the same
message id, once their lease runs out: delivery is at least once, never lost.
While a claim finds messages the relay claims again at once (per-key order often leaves a
batch partly empty with more due). After an empty claim it waits for LISTEN keel_outbox (a
hint transition_task sends) or ``poll_interval``, whichever comes first, and at least
``wake_cooldown`` after that claim: any login may NOTIFY the channel, and a flood of them
must not drive back-to-back claims. Through a pooler it only polls. A lost database
connection, once the relay has started, is reconnected with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from agentkeel.exitcodes import AgentkeelError, ExitCode
from agentkeel.relay.failpoints import Failpoints
from agentkeel.relay.logs import LOGGER, log
from agentkeel.relay.sinks import ACK, Message, Outcome, Sink

CHANNEL = "keel_outbox"
CLAIM_LOST = "55K08"


def default_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Config:
    dsn: str
    name: str = field(default_factory=default_name)
    batch: int = 100
    concurrency: int = 32
    lease: timedelta = timedelta(seconds=30)
    poll_interval: float = 1.0
    wake_cooldown: float = 0.1
    once: bool = False
    listen: bool = True
    topic_prefix: str | None = None
    prepare: bool = True  # False: prepare_threshold=None (PgBouncer before 1.21)
    handle_signals: bool = True


@dataclass
class Stats:
    batches: int = 0
    claimed: int = 0
    acked: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    claims_lost: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


# Payload and headers come back as JSON text: the relay forwards them as stored and never
# decodes them (Message), so a value no decoder accepts cannot stop a batch.
CLAIM = (
    "select c.tenant_id, c.message_id, c.topic, c.message_key, c.payload::text as payload,"
    " c.headers::text as headers, c.created_at, c.attempts, c.claim_token, c.task_id,"
    " c.event_seq, c.position"
    " from keel.claim_outbox(p_relay => %s, p_limit => %s, p_lease => %s,"
    " p_topic_prefix => %s) as c"
)


class Relay:
    def __init__(self, config: Config, sink: Sink, failpoints: Failpoints | None = None) -> None:
        self.config = config
        self.sink = sink
        self.failpoints = failpoints or Failpoints()
        self.stats = Stats()
        self.logger = logging.getLogger(LOGGER)
        self.stopping = False
        self.wake = asyncio.Event()
        self.conn: psycopg.AsyncConnection[dict[str, Any]] | None = None
        self.signals = 0

    # -- lifecycle ------------------------------------------------------------

    def stop(self) -> None:
        """Finish the publishes in flight, ack them, release the rest, then return."""
        self.signals += 1
        if self.signals > 1:
            log(self.logger, logging.WARNING, "second signal: exiting at once; claims expire")
            os._exit(int(ExitCode.INTERRUPTED))
        log(self.logger, logging.INFO, "stopping", in_flight="finishing, then acked")
        self.stopping = True
        self.wake.set()

    async def connect(self) -> psycopg.AsyncConnection[dict[str, Any]]:
        kwargs: dict[str, Any] = {"autocommit": True, "row_factory": dict_row}
        if not self.config.prepare:
            kwargs["prepare_threshold"] = None
        return await psycopg.AsyncConnection.connect(
            self.config.dsn,
            application_name="agentkeel-relay",
            connect_timeout=10,
            **kwargs,
        )

    async def run(self) -> Stats:
        loop = asyncio.get_running_loop()
        if self.config.handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
        self.conn = await self.connect()
        pooled = await self._startup_checks(self.conn)
        await self.sink.open()
        listener: asyncio.Task[None] | None = None
        if self.config.listen and not self.config.once:
            if pooled:
                log(
                    self.logger,
                    logging.INFO,
                    "pooler detected: LISTEN needs a direct connection; polling",
                    poll_interval=self.config.poll_interval,
                )
            else:
                listener = asyncio.create_task(self._listen())
        timeout = getattr(self.sink, "timeout", None)
        rounds = -(-self.config.batch // self.config.concurrency)
        if timeout is not None and rounds * timeout >= self.config.lease.total_seconds():
            log(
                self.logger,
                logging.WARNING,
                "the lease may run out while a slow batch is published: another relay could "
                "then deliver the same messages again (raise --lease or --concurrency, or "
                "lower --batch or --timeout)",
                worst_case_publish_s=rounds * timeout,
                lease_s=self.config.lease.total_seconds(),
            )
        log(
            self.logger,
            logging.INFO,
            "relay started",
            relay=self.config.name,
            sink=self.sink.url,
            batch=self.config.batch,
            concurrency=self.config.concurrency,
            lease_s=self.config.lease.total_seconds(),
            once=self.config.once,
            topic_prefix=self.config.topic_prefix,
        )
        try:
            await self._loop()
        finally:
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await listener
            await self.sink.close()
            if self.conn is not None:
                await self.conn.close()
            if self.config.handle_signals:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
        log(self.logger, logging.INFO, "relay stopped", **self.stats.as_dict())
        return self.stats

    async def _startup_checks(self, conn: psycopg.AsyncConnection[dict[str, Any]]) -> bool:
        """Refuse a database without the relay's functions; True when behind a pooler."""
        cur = await conn.execute(
            "select to_regprocedure('keel.claim_outbox(text, integer, interval, text)')"
            " is not null as ok, pg_catalog.pg_backend_pid() as pid"
        )
        row = await cur.fetchone()
        assert row is not None
        if not row["ok"]:
            raise AgentkeelError(
                "the database has no keel.claim_outbox: the agentkeel schema (with the relay's "
                "functions) is not installed; run `agentkeel migrate up` first",
                ExitCode.SCHEMA_MISSING,
            )
        return bool(row["pid"] != conn.info.backend_pid)

    async def _listen(self) -> None:
        """Set the wake event on every NOTIFY keel_outbox. When the connection fails,
        polling goes on and LISTEN is tried again after a while."""
        delay = max(self.config.poll_interval, 1.0)
        while True:
            try:
                async with await self.connect() as conn:
                    await conn.execute(f"listen {CHANNEL}")
                    self.wake.set()  # anything committed before LISTEN: look now
                    delay = max(self.config.poll_interval, 1.0)
                    async for _ in conn.notifies():
                        self.wake.set()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log(
                    self.logger,
                    logging.WARNING,
                    "LISTEN failed: polling until it works again",
                    error=f"{type(error).__name__}: {str(error).strip()[:200]}",
                    poll_interval=self.config.poll_interval,
                    retry_in_s=delay,
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 60.0)

    async def _loop(self) -> None:
        # Started: run() connected and passed the startup checks, so a connection lost
        # from here on, in the first batch too, is an outage to ride out, not bad setup.
        backoff = 0.5
        while not self.stopping:
            self.wake.clear()
            try:
                claimed = await self.cycle()
                backoff = 0.5
            except psycopg.OperationalError as error:
                log(
                    self.logger,
                    logging.ERROR,
                    "database connection lost: reconnecting",
                    error=str(error).strip().splitlines()[0] if str(error).strip() else "",
                    retry_in_s=backoff,
                )
                await self._reconnect(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            if claimed:
                continue  # more may be due right now, also after a partial batch
            if self.config.once:
                return
            await self._idle(time.monotonic())

    async def _idle(self, claimed_at: float) -> None:
        """After an empty claim: wait for a NOTIFY or the poll interval, and at least
        wake_cooldown since that claim, however many notifications arrive."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), self.config.poll_interval)
        rest = self.config.wake_cooldown - (time.monotonic() - claimed_at)
        if rest > 0 and not self.stopping:
            await asyncio.sleep(rest)

    async def _reconnect(self, delay: float) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()
        self.conn = None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.wake.wait(), delay)
        if self.stopping:
            return
        try:
            self.conn = await self.connect()
        except psycopg.OperationalError as error:
            log(self.logger, logging.ERROR, "reconnect failed", error=str(error).strip())

    # -- one batch ------------------------------------------------------------

    async def claim(self) -> list[Message]:
        assert self.conn is not None
        cur = await self.conn.execute(
            CLAIM,
            (self.config.name, self.config.batch, self.config.lease, self.config.topic_prefix),
        )
        return [Message.from_row(row) for row in await cur.fetchall()]

    async def cycle(self) -> int:
        """Claim, publish, settle one batch; the number of messages claimed."""
        if self.conn is None:
            self.conn = await self.connect()
        started = time.monotonic()
        messages = await self.claim()
        if not messages:
            return 0
        self.stats.batches += 1
        self.stats.claimed += len(messages)
        batch = self.stats.batches
        self.failpoints.hit("after_claim", batch)
        claimed_at = time.monotonic()
        outcomes = await self.sink.publish_batch(
            messages, self.config.concurrency, lambda: self.stopping
        )
        self.failpoints.hit("after_publish", batch)
        published_at = time.monotonic()
        await self.settle(messages, outcomes, batch)
        counts = {k: sum(1 for o in outcomes if o.kind == k) for k in ("ack", "retry", "dead")}
        log(
            self.logger,
            logging.DEBUG if counts["ack"] == len(messages) else logging.WARNING,
            "batch",
            claimed=len(messages),
            acked=counts["ack"],
            retried=counts["retry"],
            dead=counts["dead"],
            released=len(messages) - sum(counts.values()),
            ms=round((time.monotonic() - started) * 1000, 1),
            claim_ms=round((claimed_at - started) * 1000, 1),
            publish_ms=round((published_at - claimed_at) * 1000, 1),
            error=next((o.error for o in outcomes if o.error), None),
        )
        return len(messages)

    async def settle(
        self, messages: Sequence[Message], outcomes: Sequence[Outcome], batch: int
    ) -> None:
        """Ack, nack and release the batch in one transaction. The acks go in one pipeline
        (one round trip), one statement each, the form Citus runs on the node that holds
        the message's tenant; if a claim was lost meanwhile, they go again one by one, each
        in a savepoint, so the lost one does not undo the others."""
        assert self.conn is not None
        conn = self.conn
        pairs = list(zip(messages, outcomes, strict=True))
        acks = [m for m, o in pairs if o.kind == "ack"]
        one_by_one = [(m, o) for m, o in pairs if o.kind != "ack"]
        async with conn.transaction():
            if acks:
                try:
                    async with conn.transaction(), conn.cursor() as cur:
                        await cur.executemany(
                            "select keel.ack_outbox(%s, %s, %s)",
                            [(m.tenant_id, m.message_id, m.claim_token) for m in acks],
                        )
                    self.stats.acked += len(acks)
                except psycopg.Error as error:
                    if error.sqlstate != CLAIM_LOST:
                        raise
                    one_by_one = [(m, ACK) for m in acks] + one_by_one
            for message, outcome in one_by_one:
                await self._settle_one(message, outcome)
            self.failpoints.hit("after_ack", batch)

    async def _settle_one(self, message: Message, outcome: Outcome) -> None:
        assert self.conn is not None
        conn = self.conn
        ids = (message.tenant_id, message.message_id, message.claim_token)
        try:
            async with conn.transaction():
                if outcome.kind == "ack":
                    await conn.execute("select keel.ack_outbox(%s, %s, %s)", ids)
                    self.stats.acked += 1
                elif outcome.kind == "release":
                    await conn.execute("select keel.release_outbox(%s, %s, %s)", ids)
                    self.stats.released += 1
                else:
                    cur = await conn.execute(
                        "select state, attempts from keel.nack_outbox(%s, %s, %s, %s, %s)",
                        (*ids, outcome.error or "failed", outcome.kind == "dead"),
                    )
                    row = await cur.fetchone()
                    if row is not None and row["state"] == "dead":
                        self.stats.dead += 1
                        log(
                            self.logger,
                            logging.WARNING,
                            "dead letter",
                            message_id=str(message.message_id),
                            tenant_id=str(message.tenant_id),
                            topic=message.topic,
                            attempts=row["attempts"],
                            error=outcome.error,
                        )
                    else:
                        self.stats.retried += 1
        except psycopg.Error as error:
            if error.sqlstate != CLAIM_LOST:
                raise
            self.stats.claims_lost += 1
            log(
                self.logger,
                logging.WARNING,
                "claim lost: the lease ran out and another relay took the message",
                message_id=str(message.message_id),
                outcome=outcome.kind,
            )


async def run(config: Config, sink: Sink, failpoints: Failpoints | None = None) -> Stats:
    return await Relay(config, sink, failpoints).run()
