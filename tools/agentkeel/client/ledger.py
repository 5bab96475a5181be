"""The run ledger (G8): durable steps, and checkpoints encrypted in the client (G9, G10)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from agentkeel.checkpoints import (
    CheckpointUnreadable,
    KeyProvider,
    Sealed,
    data_key_context,
    new_data_key,
    payload_context,
    seal,
    unseal,
    uuid7,
)
from agentkeel.client.base import KeelBase, run
from agentkeel.client.calls import row_to
from agentkeel.client.rows import (
    Checkpoint,
    Json,
    LoadedCheckpoint,
    StepAttempt,
    StepStart,
)


class LedgerCalls(KeelBase):
    """The run ledger (G8): durable steps, and checkpoints encrypted in the client (G9, G10)."""

    # -- durable steps (G8) -----------------------------------------------------
    def begin_step(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        step_key: str,
        input_hash: str,
        fencing_token: int,
        *,
        retention: timedelta | None = None,
    ) -> StepStart:
        """Reuse the step's stored result (same input hash), or open its next attempt."""
        return self._one(
            "begin_step",
            StepStart,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "step_key": step_key,
                "input_hash": input_hash,
                "fencing_token": fencing_token,
            },
            {"retention": retention},
        )

    def complete_step(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        step_key: str,
        fencing_token: int,
        result: Json,
        *,
        repairs: int | None = None,
    ) -> StepAttempt:
        return self._one(
            "complete_step",
            StepAttempt,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "step_key": step_key,
                "fencing_token": fencing_token,
                "result": Jsonb(result),
            },
            {"repairs": repairs},
        )

    def fail_step(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        step_key: str,
        fencing_token: int,
        error: Json,
        *,
        retryable: bool = False,
        retry_after: timedelta | None = None,
        repairs: int | None = None,
    ) -> StepAttempt:
        return self._one(
            "fail_step",
            StepAttempt,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "step_key": step_key,
                "fencing_token": fencing_token,
                "error": Jsonb(error),
                "retryable": retryable,
            },
            {"retry_after": retry_after, "repairs": repairs},
        )

    def list_step_attempts(self, tenant_id: uuid.UUID, task_id: uuid.UUID) -> list[StepAttempt]:
        return self._call(
            "list_step_attempts",
            StepAttempt,
            tenant_id,
            {"tenant_id": tenant_id, "task_id": task_id},
        )

    # -- checkpoints (G8, G9, G10) ---------------------------------------------
    def _provider(self) -> KeyProvider:
        if self.key_provider is None:
            raise ValueError(
                "checkpoints are encrypted in the client: give Keel(..., key_provider=...) "
                "(agentkeel.checkpoints.EnvKeyProvider or FileKeyProvider)"
            )
        return self.key_provider

    def _unwrap(
        self, tenant_id: uuid.UUID, wrapped: bytes, wrapping_key_id: str, version: int
    ) -> bytes:
        provider = self._provider()
        if wrapping_key_id != provider.key_id:
            raise CheckpointUnreadable(
                f"data key version {version} was wrapped by key {wrapping_key_id}, "
                f"not by this provider's key {provider.key_id}"
            )
        return provider.unwrap(wrapped, data_key_context(tenant_id))

    def _active_data_key(self, tenant_id: uuid.UUID) -> tuple[int, bytes]:
        """The tenant's active data key, unwrapped; a new one is made when it has none."""
        provider = self._provider()
        with self.transaction(tenant_id) as conn:
            rows = run(conn, "tenant_data_key", dict_row, {"tenant_id": tenant_id})
            if not rows:
                wrapped = provider.wrap(new_data_key(), data_key_context(tenant_id))
                rows = run(
                    conn,
                    "add_tenant_data_key",
                    dict_row,
                    {
                        "tenant_id": tenant_id,
                        "wrapped_key": wrapped,
                        "wrapping_key_id": provider.key_id,
                    },
                )
        key = rows[0]
        version = int(key["key_version"])
        unwrapped = self._unwrap(
            tenant_id, bytes(key["wrapped_key"]), key["wrapping_key_id"], version
        )
        return version, unwrapped

    def save_checkpoint(
        self,
        tenant_id: uuid.UUID,
        task_id: uuid.UUID,
        fencing_token: int,
        kind: str,
        payload: Json,
        *,
        schema_version: int | None = None,
        step_key: str | None = None,
        ttl: timedelta | None = None,
        checkpoint_id: uuid.UUID | None = None,
    ) -> Checkpoint:
        """Encrypt payload (as JSON) here and store it as ciphertext, fenced by the lease."""
        checkpoint_id = checkpoint_id or uuid7()
        version, data_key = self._active_data_key(tenant_id)
        plaintext = json.dumps(payload, separators=(",", ":")).encode()
        sealed = seal(
            data_key,
            version,
            payload_context(tenant_id, task_id, checkpoint_id, version),
            plaintext,
        )
        return self._one(
            "save_checkpoint",
            Checkpoint,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "task_id": task_id,
                "checkpoint_id": checkpoint_id,
                "fencing_token": fencing_token,
                "kind": kind,
                "key_version": sealed.key_version,
                "nonce": sealed.nonce,
                "ciphertext": sealed.ciphertext,
                "payload_hash": sealed.payload_hash,
            },
            {"schema_version": schema_version, "step_key": step_key, "ttl": ttl},
        )

    def load_latest_checkpoint(
        self, tenant_id: uuid.UUID, task_id: uuid.UUID, kind: str | None = None
    ) -> LoadedCheckpoint | None:
        """The newest valid checkpoint (status ok, not expired), decrypted, or None.
        Raises CheckpointUnreadable when it does not decrypt and DataKeyDestroyed (55K10)
        when its tenant's key was destroyed."""
        rows = self._records(
            "latest_checkpoint",
            tenant_id,
            {"tenant_id": tenant_id, "task_id": task_id},
            {"kind": kind},
        )
        if not rows:
            return None
        row = rows[0]
        version = int(row["key_version"])
        sealed = Sealed(version, bytes(row["nonce"]), bytes(row["ciphertext"]))
        if sealed.payload_hash != row["payload_hash"]:
            raise CheckpointUnreadable(
                f"checkpoint {row['checkpoint_id']}: the ciphertext does not match its hash"
            )
        data_key = self._unwrap(
            tenant_id, bytes(row["wrapped_key"]), row["wrapping_key_id"], version
        )
        context = payload_context(tenant_id, task_id, row["checkpoint_id"], version)
        payload = json.loads(unseal(data_key, sealed, context))
        checkpoint = row_to(Checkpoint, {**row, "tenant_id": tenant_id})
        return LoadedCheckpoint(checkpoint, payload)

    def invalidate_checkpoint(
        self, tenant_id: uuid.UUID, checkpoint_id: uuid.UUID, fencing_token: int
    ) -> Checkpoint:
        return self._one(
            "invalidate_checkpoint",
            Checkpoint,
            tenant_id,
            {
                "tenant_id": tenant_id,
                "checkpoint_id": checkpoint_id,
                "fencing_token": fencing_token,
            },
        )

    def destroy_tenant_data_keys(self, tenant_id: uuid.UUID) -> int:
        """Owner only (G10): erase the tenant's wrapped data keys; its checkpoint payloads
        become unreadable. Returns how many key versions were destroyed."""
        return int(self._value("destroy_tenant_data_keys", tenant_id, {"tenant_id": tenant_id}))
