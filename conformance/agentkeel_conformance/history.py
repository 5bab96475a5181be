"""The history checker: what racing workers recorded, checked against the guarantees.

Each worker appends one JSON object per event to its own JSONL file:
  {"worker": ..., "op": ..., "type": "invoke" | "ok" | "fail" | "info", ...}
"ok" and "fail" carry what the database returned; "info" marks an outcome left ambiguous
by a lost connection, resolved afterwards with pg_xact_status() on the transaction id
recorded at invoke. Times are database timestamps, so one clock orders everything.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

# Fenced writes whose database time is recorded (a reservation returns none; its fencing
# shows in the completion that follows it).
FENCED = ("renew", "release", "complete", "transition")


@dataclass
class Lease:
    token: int
    acquired: datetime
    end: datetime  # expiry, or the release / terminal transition that ended it


@dataclass
class Verdict:
    violations: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def load(paths: list[Path]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for path in paths:
        with path.open() as handle:
            events.extend(json.loads(line) for line in handle if line.strip())
    return events


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


def committed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Calls whose transaction committed: ok, plus info events resolved as committed."""
    return [
        e
        for e in events
        if e["type"] == "ok" or (e["type"] == "info" and e.get("xact") == "committed")
    ]


def check(events: list[dict[str, Any]], final: dict[str, Any]) -> Verdict:
    """final: the database after the run: {"events": {task: [(seq, version)]},
    "outbox": {message key: count}, "operations": {idempotency key: state}}."""
    verdict = Verdict()
    done = committed(events)
    verdict.counts = {
        "calls": sum(1 for e in events if e["type"] == "invoke"),
        "committed": len(done),
        "refused": sum(1 for e in events if e["type"] == "fail"),
        "ambiguous": sum(1 for e in events if e["type"] == "info"),
    }

    # 1. At most one effect per idempotency key.
    effects: dict[str, int] = defaultdict(int)
    for e in events:
        if e["op"] == "effect":
            effects[e["key"]] += 1
    for key, n in sorted(effects.items()):
        if n > 1:
            verdict.violations.append(f"effect performed {n} times for idempotency key {key}")

    # 2. Lease intervals per task, from the database's own timestamps.
    leases: dict[str, dict[int, Lease]] = defaultdict(dict)
    for e in done:
        if e["op"] == "claim" and "acquired" in e:
            leases[e["task"]][e["token"]] = Lease(e["token"], _ts(e["acquired"]), _ts(e["expires"]))
    for e in done:
        lease = leases.get(e.get("task", ""), {}).get(e.get("token", -1))
        if lease is None:
            continue
        if e["op"] == "renew" and "expires" in e:
            lease.end = max(lease.end, _ts(e["expires"]))
        elif "at" in e and (
            e["op"] == "release" or (e["op"] == "transition" and e.get("terminal"))
        ):
            lease.end = min(lease.end, _ts(e["at"]))
    for task, by_token in leases.items():
        ordered = sorted(by_token.values(), key=lambda lease: lease.token)
        for before, after in itertools.pairwise(ordered):
            if after.acquired < before.end:
                verdict.violations.append(
                    f"task {task}: token {after.token} acquired at {after.acquired} while token "
                    f"{before.token} was valid until {before.end} (two valid leases at once)"
                )

    # 3. Every accepted fenced write carried the token that was current at that instant.
    for e in done:
        if e["op"] not in FENCED or "at" not in e:
            continue  # an ambiguous call that committed: its time and result are unknown
        at = _ts(e["at"])
        by_token = leases.get(e["task"], {})
        current = max(
            (lease for lease in by_token.values() if lease.acquired <= at),
            key=lambda lease: lease.token,
            default=None,
        )
        if current is None or current.token != e["token"] or at > current.end:
            verdict.violations.append(
                f"task {e['task']}: {e['op']} by {e['worker']} was accepted at {at} with token "
                f"{e['token']}, but the current lease then was "
                f"{'none' if current is None else f'token {current.token} until {current.end}'}"
            )

    # 4. Versions and event sequences contiguous per task.
    versions: dict[str, list[int]] = defaultdict(list)
    for e in done:
        if e["op"] == "transition" and "version" in e:
            versions[e["task"]].append(e["version"])
    for task, seen in versions.items():
        if len(seen) != len(set(seen)):
            verdict.violations.append(
                f"task {task}: two transitions produced the same version {sorted(seen)}"
            )
    for task, rows in final["events"].items():
        seqs = [seq for seq, _ in rows]
        if seqs != list(range(1, len(seqs) + 1)):
            verdict.violations.append(f"task {task}: event sequence {seqs} has gaps or repeats")
        if [v for _, v in rows] != list(range(1, len(rows) + 1)):
            verdict.violations.append(
                f"task {task}: state versions {[v for _, v in rows]} are not contiguous"
            )

    # 5. Nothing committed was lost: every acknowledged transition and completion is there.
    for e in done:
        present = {v for _, v in final["events"].get(e.get("task", ""), [])}
        if e["op"] == "transition" and "version" in e and e["version"] not in present:
            verdict.violations.append(
                f"task {e['task']}: committed transition to version {e['version']} is missing"
            )
        if (
            e["op"] == "complete"
            and "key" in e
            and final["operations"].get(e["key"]) != "succeeded"
        ):
            verdict.violations.append(
                f"operation {e['key']}: committed completion is missing "
                f"(state {final['operations'].get(e['key'])})"
            )

    # 6. Every committed outbox message exists exactly once; none from an aborted call.
    expected = {e["message"] for e in done if e["op"] == "transition" and e.get("message")}
    aborted = {
        e["message"]
        for e in events
        if e["op"] == "transition"
        and e.get("message")
        and e["type"] in ("fail", "info")
        and e.get("xact") != "committed"
    }
    for message in sorted(expected):
        n = final["outbox"].get(message, 0)
        if n != 1:
            verdict.violations.append(f"outbox message {message} committed but observed {n} times")
    for message in sorted(aborted - expected):
        if final["outbox"].get(message):
            verdict.violations.append(
                f"outbox message {message} exists but its transaction did not commit"
            )
    return verdict
