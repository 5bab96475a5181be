"""`agentkeel relay`: deliver the transactional outbox (G6) to NATS JetStream, HTTP, files.

Messages are claimed with a lease and a fencing token (keel.claim_outbox), published, and
acked only once the sink confirmed them; a crash re-delivers with the same message id, and
consumers dedupe by it (keel.inbox_accept). docs/relay.md is the user's guide.
"""

from agentkeel.relay.failpoints import Failpoints
from agentkeel.relay.loop import Config, Relay, Stats, run
from agentkeel.relay.sinks import Message, Outcome, Sink, parse_sink

__all__ = [
    "Config",
    "Failpoints",
    "Message",
    "Outcome",
    "Relay",
    "Sink",
    "Stats",
    "parse_sink",
    "run",
]
