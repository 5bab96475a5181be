"""OpenTelemetry spans for the worker, when ``opentelemetry-api`` is installed (the ``otel``
extra): one span per handler run, a child of the task's W3C trace context, and one per
durable step, named and attributed after the GenAI semantic conventions (``invoke_agent``,
``execute_tool``). Without the package, or without a configured tracer provider, nothing
is recorded and nothing is imported."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from agentkeel import __version__
from agentkeel.client.rows import Task

try:
    from opentelemetry import trace
except ImportError:  # the extra is not installed
    trace = None  # type: ignore[assignment]


def _parent(task: Task) -> Any:
    """The task's trace context as the span's parent, or None (a new trace)."""
    if trace is None or not task.trace_id:
        return None
    span_id = int(task.span_id, 16) if task.span_id else 0
    if not span_id:
        span_id = int(task.task_id.hex[-16:], 16) or 1  # a stable stand-in for the root
    parent = trace.SpanContext(
        trace_id=int(task.trace_id, 16),
        span_id=span_id,
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


@contextmanager
def run_span(task: Task) -> Iterator[None]:
    """``invoke_agent {workflow}`` around one handler run of the task."""
    if trace is None:
        yield
        return
    tracer = trace.get_tracer("agentkeel.worker", __version__)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": task.workflow,
        "gen_ai.conversation.id": str(task.task_id),
        "agentkeel.tenant_id": str(task.tenant_id),
        "agentkeel.task_id": str(task.task_id),
        "agentkeel.state": task.state,
        "agentkeel.fencing_token": task.fencing_token,
    }
    with tracer.start_as_current_span(
        f"invoke_agent {task.workflow}",
        context=_parent(task),
        kind=trace.SpanKind.INTERNAL,
        attributes=attributes,
    ):
        yield


@contextmanager
def step_span(step_key: str) -> Iterator[Any]:
    """``execute_tool {step}`` around one durable step, in the current run's span; yields
    the span (or None) so the step's outcome (reused, started) can be set on it."""
    if trace is None:
        yield None
        return
    tracer = trace.get_tracer("agentkeel.worker", __version__)
    with tracer.start_as_current_span(
        f"execute_tool {step_key}",
        kind=trace.SpanKind.INTERNAL,
        attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": step_key},
    ) as span:
        yield span


def mark(span: Any, reused: bool) -> None:
    """A step span's outcome: reused (its stored result, not run) or started."""
    if span is not None:
        span.set_attribute("agentkeel.step.outcome", "reused" if reused else "started")


def flush_tracing() -> None:
    """Export the spans still buffered (before an exit that skips the exit handlers)."""
    if trace is None:
        return
    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if callable(flush):
        flush()
