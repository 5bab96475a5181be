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
message id, once their lease runs out: delivery is at least once, never lost. A crash
spends no attempt (attempts are failed deliveries, nacks); a message whose earlier claims
ended with no report is published alone, after the others of its batch are settled, so a
message that crashes the relay cannot take the rest of its batch with it.
When the sink cannot be reached (an ``outage`` outcome) the claims are given back without
spending attempts and the relay pauses, doubling the pause up to ``outage_backoff_max``;
with ``once`` it exits with ExitCode.CONNECTION instead.
Every ``status_interval`` seconds it logs what it did and what waits (delivered, retried,
dead, pending, lag, rate), and names each message a claim found dead.
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
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentkeel.exitcodes import AgentkeelError, ExitCode
from agentkeel.logs import log
from agentkeel.relay.failpoints import Failpoints
from agentkeel.relay.sinks import RELEASE, Message, Outcome, Sink

LOGGER = "agentkeel.relay"
T = TypeVar("T")
CHANNEL = "keel_outbox"
CLAIM_LOST = "55K08"
MESSAGE_GONE = "42K08"  # message_not_found: an owner deleted the message meanwhile


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
    # Seconds a database call may take before the connection is given up as frozen.
    db_timeout: float = 60.0
    status_interval: float = 60.0  # 0: no periodic status line
    outage_backoff_max: float = 30.0


@dataclass
class Stats:
    batches: int = 0
    claimed: int = 0
    acked: int = 0
    retried: int = 0
    dead: int = 0
    released: int = 0
    claims_lost: int = 0
    unreachable: int = 0  # claims given back because the sink could not be reached
    reconnects: int = 0
    promoted: int = 0  # held messages the sweep made claimable (no retirement saw them)

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


# Payload and headers come back as JSON text: the relay forwards them as stored and never
# decodes them (Message), so a value no decoder accepts cannot stop a batch.
CLAIMED = (
    "select c.tenant_id, c.message_id, c.topic, c.message_key, c.payload::text as payload,"
    " c.headers::text as headers, c.created_at, c.attempts, c.claim_token, c.task_id,"
    " c.event_seq, c.position, c.claims"
)
CLAIM = (
    f"{CLAIMED} from keel.claim_outbox(p_relay => %s, p_limit => %s, p_lease => %s,"
    " p_topic_prefix => %s) as c"
)
# The acks of a batch, one call; one row per item, in order.
ACK_MESSAGES = (
    "select a.item, a.refused_sqlstate, a.refused_message from keel.ack_outbox_messages(%s) as a"
)
# One message again, alone (a suspect: its earlier claims ended with no report).
CLAIM_ONE = (
    f"{CLAIMED} from keel.claim_due_message(p_tenant_id => %s, p_message_id => %s,"
    " p_relay => %s, p_lease => %s, p_topic_prefix => %s) as c"
)


# Whether the relay may look into keel at all (to_regclass and friends fail on a schema
# the role has no USAGE on): NULL without a keel schema.
SCHEMA_ACCESS = (
    "select current_user as login, case when pg_catalog.to_regnamespace('keel') is not null"
    " then pg_catalog.has_schema_privilege('keel', 'USAGE') end as usage"
)
STARTUP = (
    "select to_regprocedure('keel.claim_outbox(text, integer, interval, text)') is not null"
    " as ok, pg_catalog.has_function_privilege(to_regprocedure("
    "'keel.claim_outbox(text, integer, interval, text)'), 'EXECUTE') as may,"
    " exists (select 1 from pg_catalog.pg_attribute where attrelid ="
    " to_regclass('keel.outbox') and attname = 'held' and not attisdropped)"
    " and to_regprocedure('keel.max_batch_items()') is not null"
    " and to_regprocedure('keel.ack_outbox_messages(jsonb)') is not null as current,"
    " pg_catalog.clock_timestamp() as now, pg_catalog.pg_backend_pid() as pid"
)
# The sweep over keys with held messages (keel.promote_outbox_heads): at most every
# SWEEP_EVERY seconds, SWEEP_KEYS keys a call, on from where the last call stopped.
SWEEP = (
    "select s.keys, s.promoted, s.last_tenant, s.last_key"
    " from keel.promote_outbox_heads(%s, %s, %s) as s"
)
SWEEP_EVERY = 2.0
SWEEP_KEYS = 5000  # about 0.1 s with long keys, each with a head in backoff
MAX_CLAIMS = (
    "select coalesce(max(s.value::integer) filter (where s.setting ="
    " 'outbox_max_unreported_claims'), 20) as max_claims,"
    " keel.max_batch_items() as max_batch from keel.settings as s"
)

# What waits, summed over topics (the periodic status line).
STATUS = (
    "select coalesce(sum(s.pending), 0) as pending, coalesce(sum(s.in_flight), 0) as in_flight,"
    " max(s.oldest_pending_age) as lag from keel.outbox_status() as s"
)

# Messages this relay's claims marked dead (keel.claim_locked_message leaves the relay's
# name in claimed_by), after the last one logged, a page at a time.
DEATHS_PAGE = 500
CLAIM_DEATHS = (
    "select o.tenant_id, o.message_id, o.topic, o.attempts, o.last_error, o.dead_at"
    " from keel.outbox as o where o.state = 'dead' and o.claimed_by = %s"
    " and (o.dead_at, o.message_id) > (%s, %s) order by o.dead_at, o.message_id"
    f" limit {DEATHS_PAGE}"
)

ZERO_UUID = uuid.UUID(int=0)


def _outage(outcomes: Sequence[Outcome]) -> str | None:
    """The error of the first outage outcome, if any: the sink could not be reached."""
    return next((o.error for o in outcomes if o.kind == "outage"), None)


class DatabaseTimeout(Exception):
    """A database call outlived Config.db_timeout; the connection was dropped."""


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
        self.outage: str | None = None  # the sink's error while it cannot be reached
        self.outage_pause = 0.0
        self.reported = Stats()
        self.reported_at = time.monotonic()
        # (dead_at, message_id) of the last message this relay's claims marked dead, logged
        self.deaths_after: tuple[Any, uuid.UUID] | None = None
        self.max_claims = 20  # settings.outbox_max_unreported_claims, read at start
        # Messages per claim: --batch, lowered to settings.max_batch_items (read at start,
        # and again when a claim is refused because the setting was lowered meanwhile).
        self.batch = config.batch
        self.swept_at = -SWEEP_EVERY  # the first sweep runs at the first chance
        self.sweep_after: tuple[uuid.UUID | None, str | None] = (None, None)

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
        listener: asyncio.Task[None] | None = None
        started = False  # connected, checked and the sink open: there is a run to report
        try:
            self.conn = await self.connect()
            pooled = await self._startup_checks(self.conn)
            await self.sink.open()
            started = True
            window = await self._check_duplicate_window()
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
            self._warn_slow_batches()
            log(
                self.logger,
                logging.INFO,
                "relay started",
                relay=self.config.name,
                sink=self.sink.url,
                batch=self.batch,
                concurrency=self.config.concurrency,
                lease_s=self.config.lease.total_seconds(),
                once=self.config.once,
                topic_prefix=self.config.topic_prefix,
                duplicate_window_s=window,
            )
            await self._loop()
        finally:
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await listener
            if started:
                with contextlib.suppress(psycopg.Error, OSError, DatabaseTimeout):
                    await self._log_claim_deaths()
                await self.sink.close()
            if self.conn is not None:
                await self.conn.close()
            if self.config.handle_signals:
                for signum in (signal.SIGTERM, signal.SIGINT):
                    loop.remove_signal_handler(signum)
            if started:
                log(self.logger, logging.INFO, "relay stopped", **self.stats.as_dict())
        return self.stats

    async def _startup_checks(self, conn: psycopg.AsyncConnection[dict[str, Any]]) -> bool:
        """Refuse a database without the relay's functions (or older than this relay);
        True when behind a pooler."""
        cur = await conn.execute(SCHEMA_ACCESS)
        access = await cur.fetchone()
        assert access is not None
        login = access["login"]
        if access["usage"] is False:
            raise AgentkeelError(
                f"role {login} may not use the keel schema: the relay's login must be a member "
                f"of keel_relay (grant keel_relay to {login})",
                ExitCode.PERMISSION,
            )
        cur = await conn.execute(STARTUP if access["usage"] else "select false as ok")
        row = await cur.fetchone()
        assert row is not None
        if not row["ok"]:
            raise AgentkeelError(
                "the database has no keel.claim_outbox: the agentkeel schema (with the relay's "
                "functions) is not installed; run `agentkeel migrate up` first",
                ExitCode.SCHEMA_MISSING,
            )
        if not row["may"]:
            raise AgentkeelError(
                f"role {login} may not claim outbox messages: the relay's login must be a "
                f"member of keel_relay (grant keel_relay to {login})",
                ExitCode.PERMISSION,
            )
        if not row["current"]:
            raise AgentkeelError(
                "the agentkeel schema is older than this relay (no keel.outbox.held, "
                "migration 0037, or no keel.ack_outbox_messages()): run `agentkeel migrate up` "
                "first (on Citus, then `agentkeel distribute --apply`)",
                ExitCode.SCHEMA_MISSING,
            )
        self.deaths_after = (row["now"], ZERO_UUID)
        pooled = bool(row["pid"] != conn.info.backend_pid)
        cur = await conn.execute(MAX_CLAIMS)
        limits = await cur.fetchone()
        assert limits is not None
        self.max_claims = int(limits["max_claims"])
        self._fit_batch(int(limits["max_batch"]))
        return pooled

    def _fit_batch(self, most: int) -> None:
        """Claim at most settings.max_batch_items messages at once, saying so when that is
        fewer than --batch asks for."""
        fitted = min(self.config.batch, most)
        if fitted != self.batch:
            log(
                self.logger,
                logging.WARNING,
                "batch lowered to settings.max_batch_items",
                requested=self.config.batch,
                batch=fitted,
            )
        self.batch = fitted

    async def _check_duplicate_window(self) -> float | None:
        """The sink's duplicate window (JetStream), checked against the re-deliveries the
        claims allow: refused when one crash is enough to store a message twice, a warning
        when a run of crashes is. None when the sink has none."""
        window = await self.sink.duplicate_window()
        if window is None:
            return None
        lease = self.config.lease.total_seconds()
        if window < lease:
            raise AgentkeelError(
                f"the stream's duplicate window ({window:g}s) is shorter than the lease "
                f"({lease:g}s): every message re-published after a relay crash would be stored "
                "twice; raise the window (nats stream edit STREAM --dupe-window ...) or lower "
                "--lease",
                ExitCode.REFUSED,
            )
        if lease * self.max_claims > window:
            log(
                self.logger,
                logging.WARNING,
                "the stream's duplicate window is shorter than lease x outbox_max_unreported_"
                "claims: a message re-published after more than window / lease relay crashes "
                "in a row is stored again (consumers still dedupe by message_id)",
                duplicate_window_s=window,
                lease_s=lease,
                max_unreported_claims=self.max_claims,
                window_needed_s=lease * self.max_claims,
            )
        return window

    def _warn_slow_batches(self) -> None:
        timeout = getattr(self.sink, "timeout", None)
        rounds = -(-self.batch // self.config.concurrency)
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

    async def _listen(self) -> None:
        """Set the wake event on every NOTIFY keel_outbox. When the connection fails,
        polling goes on and LISTEN is tried again after a while."""
        delay = max(self.config.poll_interval, 1.0)
        while True:
            try:
                async with await self.connect() as conn:
                    await conn.execute(f"listen {CHANNEL}")
                    log(self.logger, logging.INFO, "listening", channel=CHANNEL)
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
                await self._report()
                if await self._sweep(whole=self.config.once and not claimed):
                    claimed = claimed or 1  # promoted heads are due: claim again at once
                if backoff > 0.5:
                    self.stats.reconnects += 1
                    log(self.logger, logging.INFO, "reconnected")
                backoff = 0.5
            except (psycopg.OperationalError, DatabaseTimeout) as error:
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
            if self.outage is not None:
                if self.config.once:
                    raise AgentkeelError(
                        f"the sink cannot be reached: {self.outage} "
                        f"({self.stats.acked} delivered, {self.stats.unreachable} claims "
                        "given back without spending an attempt)",
                        ExitCode.CONNECTION,
                    )
                await self._sleep(self.outage_pause)
                continue
            if claimed:
                continue  # more may be due right now, also after a partial batch
            if self.config.once:
                return
            await self._idle(time.monotonic())

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake at once when the relay is told to stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopped(), seconds)

    async def _stopped(self) -> None:
        while not self.stopping:
            await self.wake.wait()
            self.wake.clear()

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
                await asyncio.wait_for(self.conn.close(), 5)
        self.conn = None
        await self._sleep(delay)
        if self.stopping:
            return
        try:
            self.conn = await self.connect()
        except psycopg.OperationalError as error:
            log(self.logger, logging.ERROR, "reconnect failed", error=str(error).strip())

    async def _db(self, call: Awaitable[T]) -> T:
        """A database call that gives up after db_timeout: a backend that stopped answering
        (frozen, or waiting on a lock) is reported, and the connection is dropped."""
        try:
            return await asyncio.wait_for(call, self.config.db_timeout)
        except TimeoutError:
            if self.conn is not None:
                self.conn.pgconn.finish()  # the socket only: nothing waits on the backend
            raise DatabaseTimeout(
                f"the database did not answer within {self.config.db_timeout:g}s"
            ) from None

    async def _sweep(self, whole: bool = False) -> int:
        """Make claimable the held messages no retirement promoted (their writer committed
        after their key's head was delivered, or the head was deleted): every SWEEP_EVERY
        seconds, SWEEP_KEYS keys on from the last call; with ``whole``, every key now
        (``once`` does it before it stops). The heads promoted."""
        now = time.monotonic()
        if self.conn is None or (not whole and now - self.swept_at < SWEEP_EVERY):
            return 0
        self.swept_at = now
        if whole:
            self.sweep_after = (None, None)
        promoted = 0
        while True:
            cur = await self._db(self.conn.execute(SWEEP, (*self.sweep_after, SWEEP_KEYS)))
            row = await cur.fetchone()
            assert row is not None
            promoted += int(row["promoted"])
            self.sweep_after = (row["last_tenant"], row["last_key"])
            if not whole or row["last_tenant"] is None or self.stopping:
                break
        self.stats.promoted += promoted
        return promoted

    # -- what the relay reports ------------------------------------------------

    async def _report(self) -> None:
        """Every status_interval: one line of what was done since the last one and what
        waits; then the messages claims found dead."""
        now = time.monotonic()
        interval = self.config.status_interval
        if interval <= 0 or now - self.reported_at < interval or self.conn is None:
            return
        conn = self.conn
        cur = await self._db(conn.execute(STATUS))
        row = await cur.fetchone()
        assert row is not None
        done, before = self.stats, self.reported
        seconds = now - self.reported_at
        delivered = done.acked - before.acked
        lag = row["lag"]
        log(
            self.logger,
            logging.INFO,
            "status",
            delivered=delivered,
            retried=done.retried - before.retried,
            dead=done.dead - before.dead,
            released=done.released - before.released,
            unreachable=done.unreachable - before.unreachable,
            claims_lost=done.claims_lost - before.claims_lost,
            promoted=done.promoted - before.promoted,
            pending=int(row["pending"]),
            in_flight=int(row["in_flight"]),
            lag_s=None if lag is None else round(lag.total_seconds(), 3),
            per_s=round(delivered / seconds, 1) if seconds > 0 else None,
            seconds=round(seconds, 1),
            sink="unreachable" if self.outage is not None else "ok",
        )
        self.reported = Stats(**self.stats.as_dict())
        self.reported_at = now
        await self._log_claim_deaths()

    async def _log_claim_deaths(self) -> None:
        """The messages this relay's claims marked dead (claimed over and over with no
        report), one "dead letter" line each; the nacks' deaths are logged as they happen."""
        if self.conn is None or self.conn.closed or self.deaths_after is None:
            return
        while True:
            cur = await self._db(
                self.conn.execute(CLAIM_DEATHS, (self.config.name, *self.deaths_after))
            )
            rows = await cur.fetchall()
            for row in rows:
                self._dead_letter(
                    row["tenant_id"],
                    row["message_id"],
                    row["topic"],
                    row["attempts"],
                    "claim",
                    row["last_error"],
                )
                self.deaths_after = (row["dead_at"], row["message_id"])
            if len(rows) < DEATHS_PAGE:
                return

    def _dead_letter(
        self,
        tenant_id: uuid.UUID,
        message_id: uuid.UUID,
        topic: str,
        attempts: int,
        decided_by: str,
        error: str | None,
    ) -> None:
        """Count and log a message that went dead: by a nack, or by a claim."""
        self.stats.dead += 1
        log(
            self.logger,
            logging.WARNING,
            "dead letter",
            message_id=str(message_id),
            tenant_id=str(tenant_id),
            topic=topic,
            attempts=attempts,
            decided_by=decided_by,
            error=error,
        )

    # -- one batch ------------------------------------------------------------

    async def claim(self) -> list[Message]:
        assert self.conn is not None
        try:
            cur = await self.conn.execute(
                CLAIM, (self.config.name, self.batch, self.config.lease, self.config.topic_prefix)
            )
        except psycopg.Error as error:
            if error.sqlstate != "22K01" or "a claim takes" not in str(error):
                raise
            # settings.max_batch_items was lowered while this relay ran: fit, claim again.
            cur = await self.conn.execute(MAX_CLAIMS)
            limits = await cur.fetchone()
            assert limits is not None
            self._fit_batch(int(limits["max_batch"]))
            cur = await self.conn.execute(
                CLAIM, (self.config.name, self.batch, self.config.lease, self.config.topic_prefix)
            )
        return [Message.from_row(row) for row in await cur.fetchall()]

    async def cycle(self) -> int:
        """Claim, publish, settle one batch; the number of messages claimed. Messages whose
        earlier claims ended with no report are published alone, after the others."""
        if self.conn is None:
            self.conn = await self.connect()
        started = time.monotonic()
        messages = await self._db(self.claim())
        if not messages:
            return 0
        self.stats.batches += 1
        self.stats.claimed += len(messages)
        batch = self.stats.batches
        self.failpoints.hit("after_claim", batch)
        claimed_at = time.monotonic()
        fresh = [m for m in messages if m.claims <= 1]
        suspects = sorted(
            (m for m in messages if m.claims > 1),
            key=lambda m: (m.claims, m.created_at, str(m.message_id)),
        )
        if suspects:
            # Given back at once and claimed again one at a time, each when its turn comes:
            # a crash then counts an unreported claim against the message being published
            # and no other, so a message that crashes the relay dies alone.
            await self._db(self._give_back(suspects))
        outcomes: list[Outcome] = []
        unreachable: str | None = None
        if fresh:
            outcomes += await self._deliver(fresh, batch)
            unreachable = _outage(outcomes)
        for suspect in suspects:
            if self.stopping or unreachable is not None:
                break
            again = await self._db(self._claim_one(suspect))
            if again is None:
                continue  # delivered, dead, or taken by another relay meanwhile
            log(
                self.logger,
                logging.INFO,
                "publishing alone: earlier claims of this message ended with no ack or nack",
                message_id=str(again.message_id),
                tenant_id=str(again.tenant_id),
                claims=again.claims,
                max_unreported_claims=self.max_claims,
            )
            answered = any(o.kind == "ack" for o in outcomes)
            results = await self._deliver([again], batch, answered)
            outcomes += results
            unreachable = _outage(results)
        published_at = time.monotonic()
        self._track_outage(unreachable, any(o.kind == "ack" for o in outcomes))
        counts = {
            k: sum(1 for o in outcomes if o.kind == k)
            for k in ("ack", "retry", "dead", "outage", "release")
        }
        log(
            self.logger,
            logging.DEBUG if counts["ack"] == len(messages) else logging.WARNING,
            "batch",
            claimed=len(messages),
            acked=counts["ack"],
            retried=counts["retry"],
            dead=counts["dead"],
            unreachable=counts["outage"],
            released=counts["release"],
            given_back=len(messages) - len(outcomes),
            ms=round((time.monotonic() - started) * 1000, 1),
            claim_ms=round((claimed_at - started) * 1000, 1),
            publish_ms=round((published_at - claimed_at) * 1000, 1),
            error=next((o.error for o in outcomes if o.error), None),
        )
        return len(messages)

    async def _deliver(
        self, group: Sequence[Message], batch: int, answered: bool = False
    ) -> list[Outcome]:
        """Publish a group of claimed messages together and settle them. An "unreachable"
        answer for a message while the sink confirmed another one of this cycle (answered,
        or an ack in the group) is about that message, not the sink: a failed attempt, so
        a message the destination keeps refusing with 429 or 503 goes dead in the end
        instead of pausing the relay for every tenant."""
        self.failpoints.publishing(m.topic for m in group)
        results = await self.sink.publish_batch(
            group, self.config.concurrency, lambda: self.stopping
        )
        if answered or any(o.kind == "ack" for o in results):
            results = [self._sink_answered(o) for o in results]
        self.failpoints.hit("after_publish", batch)
        await self._db(self.settle(group, results, batch))
        return results

    @staticmethod
    def _sink_answered(outcome: Outcome) -> Outcome:
        """An outage outcome once the sink has confirmed a message of this cycle: a message
        it called unavailable spent an attempt; one not sent goes back for the next claim."""
        if outcome.kind != "outage":
            return outcome
        return Outcome("retry", outcome.error) if outcome.tried else RELEASE

    async def _give_back(self, messages: Sequence[Message]) -> None:
        """Release claims not used yet, in one transaction; a claim lost meanwhile is
        skipped (another relay has the message)."""
        assert self.conn is not None
        conn = self.conn
        async with conn.transaction():
            for m in messages:
                try:
                    async with conn.transaction():
                        await conn.execute(
                            "select keel.release_outbox(%s, %s, %s)",
                            (m.tenant_id, m.message_id, m.claim_token),
                        )
                except psycopg.Error as error:
                    if error.sqlstate != CLAIM_LOST:
                        raise

    async def _claim_one(self, message: Message) -> Message | None:
        """Claim this message again, alone, if it is still due (keel.claim_due_message)."""
        assert self.conn is not None
        cur = await self.conn.execute(
            CLAIM_ONE,
            (
                message.tenant_id,
                message.message_id,
                self.config.name,
                self.config.lease,
                self.config.topic_prefix,
            ),
        )
        row = await cur.fetchone()
        return None if row is None else Message.from_row(row)

    def _track_outage(self, unreachable: str | None, delivered: bool) -> None:
        """Start, lengthen or end the pause an unreachable sink calls for."""
        if unreachable is not None:
            first = self.outage is None
            self.outage = unreachable
            self.outage_pause = (
                0.5 if first else min(self.outage_pause * 2, self.config.outage_backoff_max)
            )
            if first or self.outage_pause < self.config.outage_backoff_max:
                log(
                    self.logger,
                    logging.WARNING,
                    "sink unreachable: claims given back without spending an attempt; pausing",
                    error=unreachable,
                    retry_in_s=self.outage_pause,
                )
        elif delivered and self.outage is not None:
            log(self.logger, logging.INFO, "sink reachable again", sink=self.sink.url)
            self.outage = None
            self.outage_pause = 0.0

    async def settle(
        self, messages: Sequence[Message], outcomes: Sequence[Outcome], batch: int
    ) -> None:
        """Ack, nack and release the batch in one transaction. Two acks or more are one
        call (keel.ack_outbox_messages: one UPDATE per tenant of the batch, on the tenant's
        node on Citus), which refuses an item whose claim was lost and acks the others; nacks,
        releases and a single ack go one by one, each in a savepoint, so a lost one does
        not undo the others."""
        assert self.conn is not None
        conn = self.conn
        pairs = list(zip(messages, outcomes, strict=True))
        acks = [m for m, o in pairs if o.kind == "ack"]
        if len(acks) == 1:
            acks = []  # one ack alone goes as keel.ack_outbox (below): it costs less
        # A message the sink called unavailable is given back last, so it is due after the
        # ones not sent: the next claim tries those first, and a message an endpoint alone
        # refuses cannot stand at the head of every batch while the relay pauses.
        one_by_one = sorted(
            ((m, o) for m, o in pairs if not (acks and o.kind == "ack")),
            key=lambda pair: pair[1].kind == "outage" and pair[1].tried,
        )
        async with conn.transaction():
            if acks:
                items = [
                    {
                        "tenant_id": str(m.tenant_id),
                        "message_id": str(m.message_id),
                        "claim_token": m.claim_token,
                    }
                    for m in acks
                ]
                cur = await conn.execute(ACK_MESSAGES, (Jsonb(items),))
                for row in await cur.fetchall():
                    message = acks[row["item"] - 1]
                    if row["refused_sqlstate"] is None:
                        self.stats.acked += 1
                    else:
                        self._claim_lost(message, "ack", row["refused_sqlstate"])
            for message, outcome in one_by_one:
                await self._settle_one(message, outcome)
            self.failpoints.hit("after_ack", batch)

    def _claim_lost(self, message: Message, outcome: str, sqlstate: str | None) -> None:
        """A report the database refused: the claim was lost (55K08), or the message is
        gone (42K08, an owner deleted it meanwhile)."""
        self.stats.claims_lost += 1
        log(
            self.logger,
            logging.WARNING,
            "claim lost: the lease ran out and another relay took the message"
            if sqlstate == CLAIM_LOST
            else "report refused: the message is gone",
            message_id=str(message.message_id),
            outcome=outcome,
            sqlstate=sqlstate,
        )

    async def _settle_one(self, message: Message, outcome: Outcome) -> None:
        assert self.conn is not None
        conn = self.conn
        ids = (message.tenant_id, message.message_id, message.claim_token)
        try:
            async with conn.transaction():
                if outcome.kind == "ack":
                    await conn.execute("select keel.ack_outbox(%s, %s, %s)", ids)
                    self.stats.acked += 1
                elif outcome.kind in ("release", "outage"):
                    await conn.execute("select keel.release_outbox(%s, %s, %s)", ids)
                    if outcome.kind == "release":
                        self.stats.released += 1
                    else:
                        self.stats.unreachable += 1
                else:
                    cur = await conn.execute(
                        "select state, attempts from keel.nack_outbox(%s, %s, %s, %s, %s)",
                        (*ids, outcome.error or "failed", outcome.kind == "dead"),
                    )
                    row = await cur.fetchone()
                    if row is not None and row["state"] == "dead":
                        self._dead_letter(
                            message.tenant_id,
                            message.message_id,
                            message.topic,
                            row["attempts"],
                            "nack",
                            outcome.error,
                        )
                    else:
                        self.stats.retried += 1
        except psycopg.Error as error:
            if error.sqlstate not in (CLAIM_LOST, MESSAGE_GONE):
                raise
            self._claim_lost(message, outcome.kind, error.sqlstate)


async def run(config: Config, sink: Sink, failpoints: Failpoints | None = None) -> Stats:
    return await Relay(config, sink, failpoints).run()
