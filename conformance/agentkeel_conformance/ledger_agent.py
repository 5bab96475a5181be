"""A scripted five-step agent run on the agentkeel client, for the G8 crash test.

    AGENTKEEL_DSN=... python -m agentkeel_conformance.ledger_agent \
        --tenant T --task T --counter FILE

It claims the task (waiting while another worker's lease is valid), resumes from the
latest checkpoint if there is one, and runs steps 1-5. Each step's input is derived from
the previous step's output, so a resumed run computes the same input hashes. A step runs
through keel.begin_step: a completed step is reused; otherwise the "provider" is called,
which appends one line to the counter file (outside the database, so a rolled-back or
killed run still counts) and the result is stored with keel.complete_step. A SYNTHESIS
checkpoint is saved after every even step. With --pause-after N it prints "paused" after
step N has committed and sleeps, to be killed. The checkpoint key comes from
$AGENTKEEL_CHECKPOINT_KEY.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg

from agentkeel.checkpoints import EnvKeyProvider
from agentkeel.client import Keel, Task
from agentkeel.errors import LeaseHeld

STEPS = 5


def provider_call(counter: str, step: int, step_input: dict[str, Any]) -> dict[str, Any]:
    """The paid call: counted in a file, fsynced before the answer is used."""
    with open(counter, "a", encoding="utf-8") as f:
        f.write(f"step-{step}\n")
        f.flush()
        os.fsync(f.fileno())
    return {"step": step, "answer": f"answer {step} to {step_input['previous']}"}


def claim(keel: Keel, tenant: uuid.UUID, task: uuid.UUID, owner: str, lease: timedelta) -> Task:
    deadline = time.monotonic() + 30
    while True:
        try:
            return keel.claim_lease(tenant, task, owner, lease)
        except LeaseHeld:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def run(args: argparse.Namespace) -> None:
    tenant, task_id = uuid.UUID(args.tenant), uuid.UUID(args.task)
    lease = timedelta(milliseconds=args.lease_ms)
    with psycopg.connect(args.dsn, autocommit=True, prepare_threshold=None) as conn:
        keel = Keel(conn, key_provider=EnvKeyProvider())
        token = claim(keel, tenant, task_id, args.owner, lease).fencing_token
        loaded = keel.load_latest_checkpoint(tenant, task_id)
        state: dict[str, Any] = loaded.payload if loaded else {"next_step": 1, "outputs": []}
        print(f"claimed token {token}, resuming at step {state['next_step']}", flush=True)
        for step in range(state["next_step"], STEPS + 1):
            outputs = state["outputs"]
            step_input = {"step": step, "previous": outputs[-1]["answer"] if outputs else None}
            input_hash = hashlib.sha256(json.dumps(step_input, sort_keys=True).encode()).hexdigest()
            start = keel.begin_step(tenant, task_id, f"step-{step}", input_hash, token)
            if start.outcome == "reused":
                output = start.result
            elif start.outcome == "started":
                output = provider_call(args.counter, step, step_input)
                keel.complete_step(tenant, task_id, f"step-{step}", token, output)
            else:
                sys.exit(f"step {step}: unexpected outcome {start.outcome}")
            state = {"next_step": step + 1, "outputs": [*outputs, output]}
            print(f"step {step} committed ({start.outcome})", flush=True)
            if step % 2 == 0:
                keel.save_checkpoint(
                    tenant, task_id, token, "SYNTHESIS", state, step_key=f"step-{step}"
                )
            keel.renew_lease(tenant, task_id, token, lease)
            if step == args.pause_after:
                print("paused", flush=True)
                time.sleep(3600)
        print("done", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=os.environ.get("AGENTKEEL_DSN"), help="$AGENTKEEL_DSN")
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--counter", required=True, help="file with one line per provider call")
    parser.add_argument("--owner", default="ledger-agent")
    parser.add_argument("--lease-ms", type=int, default=1500)
    parser.add_argument("--pause-after", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.dsn:
        parser.error("give --dsn or $AGENTKEEL_DSN")
    run(args)


if __name__ == "__main__":
    main()
