"""A worker app for tests/test_worker.py: an agent task of three durable steps, each a call of
a "provider" that appends a line to $AGENTKEEL_TEST_CALLS/<task id>.log. A task whose metadata
names a step in "block" stops in that step's call until the file <task id>.<step>.go exists
(it first makes <task id>.<step>.waiting), so a test can kill, pause or stop the worker there.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from agentkeel.worker import Context, Registry

CALLS = Path(os.environ["AGENTKEEL_TEST_CALLS"])
STEPS = ("plan", "call", "answer")

registry = Registry()


def provider(ctx: Context, step: str) -> dict[str, Any]:
    with (CALLS / f"{ctx.task_id}.log").open("a") as log:
        log.write(f"{step}\n")
    if ctx.metadata.get("block") == step:
        go = CALLS / f"{ctx.task_id}.{step}.go"
        (CALLS / f"{ctx.task_id}.{step}.waiting").touch()
        deadline = time.monotonic() + 120
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return {"step": step, "answer": len(step)}


@registry.handler("agent")
def agent(ctx: Context) -> str:
    for step in STEPS:
        ctx.step(step, {"step": step}, lambda step=step: provider(ctx, step))
    return "done"
