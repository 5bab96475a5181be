"""Where the relay delivers: NATS JetStream, an HTTP endpoint, a file of JSON lines, stdout.

A sink turns each claimed message into an Outcome: ``ack`` once the destination confirmed
it (JetStream's PubAck, a 2xx answer, the line fsynced); ``outage`` when the destination
could not be reached or says it is unavailable (no connection, a broker that is down, 502,
503, 504, 429, a file that cannot be written): not the message's fault, so the relay gives
the claim back without spending an attempt and pauses (unless the destination confirmed
another message of the same cycle: then it is an attempt);
``retry`` when the destination took the message and failed it but may not next time (a
timeout waiting for its answer, 500, 408, other broker errors): an attempt; ``dead`` when
it never will (any other 4xx, a topic that makes no valid subject); ``release`` when the
relay is stopping and the message was not sent. Every destination is given the message id
to drop duplicates by: JetStream's ``Nats-Msg-Id`` header, HTTP's ``Idempotency-Key``, the
``message_id`` of each record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

from agentkeel.exitcodes import AgentkeelError, ExitCode

Kind = Literal["ack", "retry", "dead", "release", "outage"]


@dataclass(frozen=True)
class Message:
    """One claimed outbox row (keel.claim_outbox).

    payload and headers are the JSON text the database stored, never decoded here: the
    relay forwards them byte for byte, so no value a decoder would refuse (a number of
    thousands of digits, say) can fail a message, let alone its batch."""

    tenant_id: uuid.UUID
    message_id: uuid.UUID
    topic: str
    message_key: str | None
    payload: str  # JSON text
    headers: str  # JSON text (an object)
    created_at: datetime
    attempts: int
    claim_token: int
    task_id: uuid.UUID | None = None
    event_seq: int | None = None
    position: int | None = None
    # Claims since the last report, this one included: more than 1 means earlier claims
    # ended with no ack or nack (a relay crashed or lost its connection while delivering).
    claims: int = 1

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Message:
        return cls(
            tenant_id=row["tenant_id"],
            message_id=row["message_id"],
            topic=row["topic"],
            message_key=row.get("message_key"),
            payload=row.get("payload") or "null",
            headers=row.get("headers") or "{}",
            created_at=row["created_at"],
            attempts=int(row.get("attempts") or 0),
            claim_token=int(row["claim_token"]),
            task_id=row.get("task_id"),
            event_seq=row.get("event_seq"),
            position=row.get("position"),
            claims=int(row.get("claims") or 1),
        )

    def body(self) -> bytes:
        """What every sink delivers: the same JSON object everywhere, payload and headers
        spliced in as stored."""
        fields: list[tuple[str, str]] = [
            ("message_id", json.dumps(str(self.message_id))),
            ("tenant_id", json.dumps(str(self.tenant_id))),
            ("topic", json.dumps(self.topic, ensure_ascii=False)),
            ("key", json.dumps(self.message_key, ensure_ascii=False)),
            ("headers", self.headers),
            ("payload", self.payload),
            ("created_at", json.dumps(self.created_at.isoformat())),
            ("task_id", json.dumps(None if self.task_id is None else str(self.task_id))),
            ("event_seq", json.dumps(self.event_seq)),
            ("position", json.dumps(self.position)),
        ]
        return ("{" + ",".join(f'"{k}":{v}' for k, v in fields) + "}").encode()


@dataclass(frozen=True)
class Outcome:
    kind: Kind
    error: str | None = None
    tried: bool = True  # False: not sent, because the sink was just found unreachable


ACK = Outcome("ack")
RELEASE = Outcome("release")


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class Sink:
    """A destination. publish_batch is what the relay calls; subclasses give publish (one
    message, run up to ``concurrency`` at a time) or override publish_batch."""

    url: str

    async def open(self) -> None:
        """Prepare; must not fail because the destination is down (that is a retry)."""

    async def close(self) -> None:
        """Release connections."""

    async def duplicate_window(self) -> float | None:
        """Seconds within which the destination drops a message id it has stored already,
        or None when it keeps no such window (or it cannot be read now)."""
        return None

    async def publish(self, message: Message) -> Outcome:
        raise NotImplementedError

    async def publish_batch(
        self, messages: Sequence[Message], concurrency: int, stopping: Callable[[], bool]
    ) -> list[Outcome]:
        """Publish up to ``concurrency`` at once. Once ``stopping()`` is true, messages not
        yet started are released; those in flight finish. Once one publish finds the
        destination unreachable, the messages not yet started are not tried (the same
        outage outcome): an outage costs one timeout per batch, not one per message."""
        gate = asyncio.Semaphore(max(1, concurrency))
        outage: list[Outcome] = []

        async def one(message: Message) -> Outcome:
            async with gate:
                if stopping():
                    return RELEASE
                if outage:
                    return Outcome("outage", outage[0].error, tried=False)
                try:
                    outcome = await self.publish(message)
                except Exception as error:  # a sink bug or an unexpected failure: retry later
                    return Outcome("retry", _describe(error))
                if outcome.kind == "outage":
                    outage.append(outcome)
                return outcome

        return list(await asyncio.gather(*(one(m) for m in messages)))


class FileSink(Sink):
    """JSON lines appended to a file, fsynced before any of them is acked. The file is
    opened for each batch (so it may be rotated by renaming) and created if missing."""

    def __init__(self, url: str, path: Path) -> None:
        self.url = url
        self.path = path

    def _write(self, lines: bytes) -> None:
        with open(self.path, "ab") as f:
            f.write(lines)
            f.flush()
            os.fsync(f.fileno())

    async def publish_batch(
        self, messages: Sequence[Message], concurrency: int, stopping: Callable[[], bool]
    ) -> list[Outcome]:
        if not messages:
            return []
        lines = b"".join(m.body() + b"\n" for m in messages)
        try:
            await asyncio.to_thread(self._write, lines)
        except OSError as error:  # a full disk, a missing directory: never the message
            failed = Outcome("outage", f"file {self.path}: {_describe(error)}")
            return [failed] * len(messages)
        return [ACK] * len(messages)


class StdoutSink(Sink):
    """JSON lines on standard output (logs go to stderr)."""

    url = "-"

    async def publish_batch(
        self, messages: Sequence[Message], concurrency: int, stopping: Callable[[], bool]
    ) -> list[Outcome]:
        try:
            sys.stdout.buffer.write(b"".join(m.body() + b"\n" for m in messages))
            sys.stdout.buffer.flush()
        except OSError as error:
            return [Outcome("outage", f"stdout: {_describe(error)}")] * len(messages)
        return [ACK] * len(messages)


# Answers that say the endpoint, not the message, is the trouble: pause, spend no attempt.
UNAVAILABLE = frozenset({429, 502, 503, 504})
# 4xx answers that mean "try again later"; every other 4xx is final.
RETRYABLE_4XX = frozenset({408})


def http_outcome(status: int) -> Outcome:
    """What an HTTP status means for a message."""
    if 200 <= status < 300:
        return ACK
    if status in UNAVAILABLE:
        return Outcome("outage", f"HTTP {status}")
    if 400 <= status < 500 and status not in RETRYABLE_4XX:
        return Outcome("dead", f"HTTP {status}")
    return Outcome("retry", f"HTTP {status}")


class HttpSink(Sink):
    """POST each record as JSON, with ``Idempotency-Key: <message id>``."""

    def __init__(self, url: str, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        self.client: Any = None

    async def open(self) -> None:
        import httpx

        self.client = httpx.AsyncClient(timeout=self.timeout, follow_redirects=False)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    async def publish(self, message: Message) -> Outcome:
        import httpx

        try:
            response = await self.client.post(
                self.url,
                content=message.body(),
                headers={
                    "Content-Type": "application/json",
                    "Idempotency-Key": str(message.message_id),
                    "Keel-Topic": message.topic,
                },
            )
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as error:
            # nothing reached the endpoint: it is down or unreachable
            return Outcome("outage", f"{self.url}: cannot connect ({_describe(error)})")
        except httpx.HTTPError as error:  # read timeouts, dropped answers, protocol errors
            return Outcome("retry", _describe(error))
        return http_outcome(response.status_code)


def subject_for(prefix: str, topic: str) -> str | None:
    """The JetStream subject of a topic, or None when it would not be a valid one."""
    subject = f"{prefix}.{topic}"
    tokens = subject.split(".")
    if any(not t or t in ("*", ">") or any(c.isspace() for c in t) for t in tokens):
        return None
    return subject


class NatsSink(Sink):
    """JetStream publish to ``<prefix>.<topic>`` with ``Nats-Msg-Id: <message id>``; acked
    in the database only after the stream's PubAck. A stream must capture the subjects
    (with a duplicate window longer than a lease): without one the publish has no
    responder and is retried."""

    def __init__(self, url: str, server: str, prefix: str, timeout: float) -> None:
        self.url = url
        self.server = server
        self.prefix = prefix
        self.timeout = timeout
        self.nc: Any = None
        self.js: Any = None
        self.lock = asyncio.Lock()

    async def _connected(self) -> Any:
        import nats

        async with self.lock:
            if self.nc is None or self.nc.is_closed:

                async def quiet(error: Exception) -> None:
                    pass  # every failed publish is logged by the relay with its error

                self.nc = await asyncio.wait_for(
                    nats.connect(
                        servers=[self.server],
                        connect_timeout=self.timeout,
                        allow_reconnect=True,
                        max_reconnect_attempts=-1,
                        reconnect_time_wait=0.5,
                        error_cb=quiet,
                        name="agentkeel-relay",
                    ),
                    timeout=self.timeout + 1,
                )
                self.js = self.nc.jetstream(timeout=self.timeout)
        return self.js

    async def _why_unreachable(self) -> str | None:
        """What a plain TCP connection to the server says: nats-py reports a refusal as a
        timeout of its reconnect loop."""
        parts = urlsplit(self.server)
        try:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(parts.hostname, parts.port), self.timeout
            )
        except ConnectionRefusedError:
            return "connection refused"
        except TimeoutError:
            return f"no answer within {self.timeout:g}s"
        except OSError as error:
            return _describe(error)
        writer.close()
        return None  # it accepts connections: the NATS handshake is what failed

    async def duplicate_window(self) -> float | None:
        """The duplicate window of the stream that captures this relay's subjects; None
        when the broker cannot be reached now (an outage when the relay publishes) or no
        stream captures them (then every publish fails, an attempt each)."""
        try:
            js = await self._connected()
            name = await js.find_stream_name_by_subject(f"{self.prefix}.x")
            info = await js.stream_info(name)
        except Exception:
            return None
        window = info.config.duplicate_window
        return None if window is None else float(window)

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            # closing a connection to a broker that is gone may fail: nothing to do then
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.nc.close(), timeout=self.timeout)

    async def publish_batch(
        self, messages: Sequence[Message], concurrency: int, stopping: Callable[[], bool]
    ) -> list[Outcome]:
        """Connect once for the batch: with the broker down, every message is retried
        after one connection attempt, not one each."""
        try:
            await self._connected()
        except Exception as error:
            why = await self._why_unreachable() or _describe(error)
            unreachable = Outcome("outage", f"nats: cannot connect to {self.server} ({why})")
            return [unreachable] * len(messages)
        return await super().publish_batch(messages, concurrency, stopping)

    async def publish(self, message: Message) -> Outcome:
        subject = subject_for(self.prefix, message.topic)
        if subject is None:
            return Outcome(
                "dead", f"topic {message.topic!r} makes no valid NATS subject under {self.prefix}"
            )
        try:
            js = await self._connected()
            await js.publish(
                subject,
                message.body(),
                timeout=self.timeout,
                headers={"Nats-Msg-Id": str(message.message_id)},
            )
        except Exception as error:  # timeouts, disconnections, API errors
            if self.nc is None or not self.nc.is_connected:
                return Outcome(
                    "outage", f"nats: connection to {self.server} lost ({_describe(error)})"
                )
            return Outcome("retry", f"nats: {_describe(error)}")
        return ACK


def bad_sink(url: str, why: str) -> AgentkeelError:
    return AgentkeelError(
        f"bad sink URL {url!r}: {why} (expected nats://host:port/subject.prefix, "
        "http(s)://host/path, file:PATH or -)",
        ExitCode.USAGE,
    )


def parse_sink(url: str, timeout: float = 5.0) -> Sink:
    """The sink a URL names; AgentkeelError(USAGE) in one line when it names none."""
    if url == "-":
        return StdoutSink()
    if url.startswith("file:"):
        rest = url[len("file:") :]
        if rest.startswith("//"):
            parts = urlsplit(url)
            if parts.netloc not in ("", "localhost"):
                raise bad_sink(url, "a file URL names no remote host")
            rest = unquote(parts.path)
        if not rest:
            raise bad_sink(url, "file: needs a path")
        return FileSink(url, Path(rest))
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise bad_sink(url, str(error)) from error
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise bad_sink(url, "no host")
        return HttpSink(url, timeout)
    if parts.scheme in ("nats", "tls"):
        if not parts.hostname:
            raise bad_sink(url, "no host")
        prefix = parts.path.strip("/")
        if not prefix or subject_for(prefix, "x") is None:
            raise bad_sink(url, "needs a subject prefix as its path, e.g. /keel.outbox")
        if parts.query or parts.fragment:
            raise bad_sink(url, "no query or fragment")
        netloc = parts.netloc if port else f"{parts.netloc}:4222"
        return NatsSink(url, f"{parts.scheme}://{netloc}", prefix, timeout)
    raise bad_sink(url, f"unknown scheme {parts.scheme!r}" if parts.scheme else "no scheme")
