"""The outbox and inbox (G6): claim, ack, nack, release, replay, sweep, status."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from agentkeel.client.base import KeelBase
from agentkeel.client.calls import refusal
from agentkeel.client.rows import (
    AckOutcome,
    OutboxMessage,
    OutboxStatus,
    OutboxSweep,
)


class OutboxCalls(KeelBase):
    """The outbox and inbox (G6): claim, ack, nack, release, replay, sweep, status."""

    # -- outbox delivery (G6) --------------------------------------------------
    # The relay's calls (keel_relay) need no tenant context; the consumers' calls do.
    def claim_outbox(
        self,
        relay: str,
        limit: int | None = None,
        lease: timedelta | None = None,
        topic_prefix: str | None = None,
    ) -> list[OutboxMessage]:
        """Claim up to `limit` due messages of any tenant, each with a new claim token."""
        return self._call(
            "claim_outbox",
            OutboxMessage,
            None,
            {"relay": relay},
            {"limit": limit, "lease": lease, "topic_prefix": topic_prefix},
        )

    def ack_outbox(self, tenant_id: uuid.UUID, message_id: uuid.UUID, claim_token: int) -> None:
        self._value(
            "ack_outbox",
            None,
            {"tenant_id": tenant_id, "message_id": message_id, "claim_token": claim_token},
        )

    def ack_outbox_messages(self, items: Sequence[Mapping[str, Any]]) -> list[AckOutcome]:
        """Ack many claimed messages in one round trip (keel.ack_outbox_messages). Each item
        has tenant_id, message_id and claim_token; an item whose claim was lost (55K08) or
        whose message is gone (42K08) changes nothing and says why, the others are acked."""
        rows = self._records(
            "ack_outbox_messages",
            None,
            {
                "items": [
                    {
                        "tenant_id": str(i["tenant_id"]),
                        "message_id": str(i["message_id"]),
                        "claim_token": int(i["claim_token"]),
                    }
                    for i in items
                ]
            },
        )
        return [AckOutcome(r["item"], r["message_id"], refusal(r)) for r in rows]

    def nack_outbox(
        self,
        tenant_id: uuid.UUID,
        message_id: uuid.UUID,
        claim_token: int,
        error: str,
        *,
        dead: bool | None = None,
    ) -> OutboxMessage:
        return self._one(
            "nack_outbox",
            OutboxMessage,
            None,
            {
                "tenant_id": tenant_id,
                "message_id": message_id,
                "claim_token": claim_token,
                "error": error,
            },
            {"dead": dead},
        )

    def release_outbox(self, tenant_id: uuid.UUID, message_id: uuid.UUID, claim_token: int) -> None:
        self._value(
            "release_outbox",
            None,
            {"tenant_id": tenant_id, "message_id": message_id, "claim_token": claim_token},
        )

    def promote_outbox_heads(
        self,
        after: tuple[uuid.UUID, str] | None = None,
        keys: int | None = None,
    ) -> OutboxSweep:
        """The relay's sweep: make claimable each held message with nothing pending ahead
        of it, for up to `keys` keys after the cursor `after` (tenant, key)."""
        return self._one(
            "promote_outbox_heads",
            OutboxSweep,
            None,
            {},
            {
                "after_tenant": after[0] if after else None,
                "after_key": after[1] if after else None,
                "keys": keys,
            },
        )

    def sweep_outbox_heads(self) -> int:
        """The whole sweep, every key from the first (as `agentkeel relay --once` runs it
        before it stops); the heads promoted."""
        promoted, after = 0, None
        while True:
            sweep = self.promote_outbox_heads(after)
            promoted += sweep.promoted
            if sweep.last_tenant is None or sweep.last_key is None:
                return promoted
            after = (sweep.last_tenant, sweep.last_key)

    def outbox_status(self) -> list[OutboxStatus]:
        """Per topic across tenants: pending, in flight, dead, oldest pending age."""
        return self._call("outbox_status", OutboxStatus, None, {})

    def dead_outbox(
        self,
        tenant_id: uuid.UUID,
        *,
        topic: str | None = None,
        after: uuid.UUID | None = None,
        limit: int | None = None,
    ) -> list[OutboxMessage]:
        """One page of the tenant's dead messages in message_id order."""
        return self._call(
            "dead_outbox",
            OutboxMessage,
            tenant_id,
            {"tenant_id": tenant_id},
            {"topic": topic, "after": after, "limit": limit},
        )

    def replay_outbox(self, tenant_id: uuid.UUID, message_id: uuid.UUID) -> OutboxMessage:
        """A dead message back to pending, same message id, attempts and claims 0."""
        return self._one(
            "replay_outbox",
            OutboxMessage,
            tenant_id,
            {"tenant_id": tenant_id, "message_id": message_id},
        )

    def relay_replay_outbox(self, tenant_id: uuid.UUID, message_id: uuid.UUID) -> OutboxMessage:
        """replay_outbox for a keel_relay login: any tenant's dead message, no context."""
        return self._one(
            "relay_replay_outbox",
            OutboxMessage,
            None,
            {"tenant_id": tenant_id, "message_id": message_id},
        )

    def inbox_accept(self, tenant_id: uuid.UUID, consumer: str, message_id: uuid.UUID) -> bool:
        """True the first time this consumer accepts the id, False for a duplicate. Call it
        inside the transaction that applies the effect (``with keel.transaction(tenant)``)."""
        return bool(
            self._value(
                "inbox_accept",
                tenant_id,
                {"tenant_id": tenant_id, "consumer": consumer, "message_id": message_id},
            )
        )
