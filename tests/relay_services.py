"""What the relay tests share: a NATS server of their own, JetStream streams, an HTTP
receiver, committed outbox messages, and the relay as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from agentkeel.client import Keel, set_tenant_context

FAILPOINT_ENV = "AGENTKEEL_RELAY_FAILPOINT"
SHARED_NATS = "nats://127.0.0.1:4222"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def nats_binary() -> str:
    found = shutil.which("nats-server") or (
        "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else None
    )
    if found is None:
        pytest.skip("nats-server is not installed (apt-get install nats-server; .ci/run does)")
    return found


class NatsServer:
    """nats-server with JetStream on a free loopback port; its store survives a restart."""

    def __init__(self, store: Path) -> None:
        self.binary = nats_binary()
        self.port = free_port()
        self.store = store
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> NatsServer:
        self.proc = subprocess.Popen(
            [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError("nats-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=15)
            self.proc = None


def nats_answers(url: str) -> bool:
    host, port = url.removeprefix("nats://").split(":")
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, int(port))) == 0


@contextmanager
def any_nats(store: Path) -> Iterator[str]:
    """The machine's NATS on 127.0.0.1:4222 when it answers (CI starts it), else a server
    of our own for the block."""
    if nats_answers(SHARED_NATS):
        yield SHARED_NATS
        return
    server = NatsServer(store).start()
    try:
        yield server.url
    finally:
        server.stop()


async def _js(url: str, action: Callable[[Any], Any]) -> Any:
    import nats

    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=1)
    try:
        return await action(nc.jetstream(timeout=10))
    finally:
        await nc.close()


def add_stream(url: str, name: str, prefix: str) -> None:
    async def act(js: Any) -> None:
        await js.add_stream(name=name, subjects=[f"{prefix}.>"], duplicate_window=600.0)

    asyncio.run(_js(url, act))


def delete_stream(url: str, name: str) -> None:
    async def act(js: Any) -> None:
        await js.delete_stream(name)

    asyncio.run(_js(url, act))


def stream_messages(url: str, name: str) -> list[tuple[str, dict[str, Any]]]:
    """Every message the stream holds: (Nats-Msg-Id, body)."""

    async def act(js: Any) -> list[tuple[str, dict[str, Any]]]:
        info = await js.stream_info(name)
        found = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            msg = await js.get_msg(name, seq)
            found.append(((msg.headers or {}).get("Nats-Msg-Id", ""), json.loads(msg.data)))
        return found

    return list(asyncio.run(_js(url, act)))


@contextmanager
def stream(url: str) -> Iterator[tuple[str, str]]:
    """A uniquely named stream capturing <prefix>.>, with a 5-minute duplicate window;
    deleted afterwards. Yields (stream name, subject prefix)."""
    suffix = uuid.uuid4().hex[:10]
    name, prefix = f"AKTEST_{suffix}", f"aktest-{suffix}"
    add_stream(url, name, prefix)
    try:
        yield name, prefix
    finally:
        delete_stream(url, name)


# -- HTTP --------------------------------------------------------------------


@dataclass
class Receiver:
    """An HTTP endpoint on loopback that answers each POST with the status its record's
    payload asks for ({"status": 503}; "hang" sleeps past the relay's timeout)."""

    requests: list[tuple[dict[str, str], dict[str, Any]]] = field(default_factory=list)
    delay: float = 0.0
    url: str = ""


@contextmanager
def http_receiver(delay: float = 0.0) -> Iterator[Receiver]:
    receiver = Receiver(delay=delay)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                receiver.requests.append((dict(self.headers.items()), body))
            asked = (body.get("payload") or {}).get("status", 200)
            if asked == "hang" or receiver.delay:
                time.sleep(receiver.delay or 4)
                asked = 200
            self.send_response(int(asked))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


# -- the database ------------------------------------------------------------


@dataclass
class Outbox:
    """A tenant and a workflow on a test database, to commit messages with."""

    dsn: str
    tenant: uuid.UUID
    workflow: str

    @classmethod
    def make(cls, dsn: str) -> Outbox:
        workflow = f"relay-{uuid.uuid4().hex[:8]}"
        tenant = uuid.uuid4()
        with psycopg.connect(dsn, autocommit=True) as conn:
            keel = Keel(conn)
            keel.define_workflow(workflow, 1, "queued", [("queued", "done")])
            keel.create_tenant("relay-test", tenant)
        return cls(dsn, tenant, workflow)

    def commit(
        self,
        topic: str,
        payloads: list[Any],
        conn: psycopg.Connection | None = None,
        keys: list[str] | None = None,
    ) -> list[str]:
        """One transition of a new task carrying one message per payload (with the key of
        the same place in keys, if given); their ids."""
        own = conn is None
        conn = conn or psycopg.connect(self.dsn, autocommit=True)
        try:
            keel = Keel(conn)
            task = keel.create_task(self.tenant, self.workflow, 1)
            keel.transition_task(
                self.tenant,
                task.task_id,
                1,
                "done",
                outbox=[
                    {"topic": topic, "payload": p, **({"key": keys[i]} if keys else {})}
                    for i, p in enumerate(payloads)
                ],
            )
            with keel.transaction(self.tenant):
                rows = conn.execute(
                    "select message_id from keel.outbox where tenant_id = %s and task_id = %s"
                    " order by position",
                    (self.tenant, task.task_id),
                ).fetchall()
            return [str(r[0]) for r in rows]
        finally:
            if own:
                conn.close()

    def rows(self) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn, conn.transaction():
            set_tenant_context(conn, self.tenant)
            cur = conn.cursor(row_factory=dict_row)
            return cur.execute(
                "select *, available_at > now() as backing_off from keel.outbox"
                " where tenant_id = %s order by created_at, position",
                (self.tenant,),
            ).fetchall()

    def states(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.rows():
            counts[row["state"]] = counts.get(row["state"], 0) + 1
        return counts

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            rows = self.rows()
            if predicate(rows):
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out; outbox: {[(r['state'], r['attempts']) for r in rows]}"
                )
            time.sleep(0.1)


def relay_command(dsn: str, sink: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "agentkeel.cli", "relay", "--dsn", dsn, "--sink", sink, *args]


def relay_env(failpoint: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (FAILPOINT_ENV, "AGENTKEEL_DSN")}
    if failpoint:
        env[FAILPOINT_ENV] = failpoint
    return env


def run_relay(
    dsn: str, sink: str, *args: str, failpoint: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        relay_command(dsn, sink, *args),
        env=relay_env(failpoint),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_relay(dsn: str, sink: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        relay_command(dsn, sink, *args),
        env=relay_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
