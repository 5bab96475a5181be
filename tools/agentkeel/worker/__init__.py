"""The worker runtime: register a handler per workflow (and state), and ``agentkeel worker``
claims due tasks in batches, keeps their leases alive, runs the handlers and writes every
outcome as a guarded transition with its event (docs/worker.md).

    from agentkeel.worker import Registry

    registry = Registry()

    @registry.handler("summarize", "queued")
    def summarize(ctx):
        text = ctx.step("fetch", ctx.metadata, lambda: fetch(ctx.metadata["url"]))
        summary = ctx.step("model", text, lambda: model.summarize(text))
        ctx.transition("done", payload={"summary": summary})
"""

from agentkeel.worker.context import Context, input_hash
from agentkeel.worker.outcomes import Cancelled, Fail, MoveTo, Retry, Snooze, StepFailed
from agentkeel.worker.registry import Handler, Registry, load_registry
from agentkeel.worker.runtime import Config, ConfigError, Stats, Worker, run_worker

__all__ = [
    "Cancelled",
    "Config",
    "ConfigError",
    "Context",
    "Fail",
    "Handler",
    "MoveTo",
    "Registry",
    "Retry",
    "Snooze",
    "Stats",
    "StepFailed",
    "Worker",
    "input_hash",
    "load_registry",
    "run_worker",
]
