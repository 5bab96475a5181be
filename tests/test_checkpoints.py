"""Checkpoint encryption in the client: key providers, wrapping, and what the database
refuses or accepts around the ciphertext (the G8 conformance tests cover the rest)."""

from __future__ import annotations

import base64
import hashlib
import os
import uuid
from datetime import timedelta

import psycopg
import pytest

from agentkeel.checkpoints import (
    CheckpointUnreadable,
    EnvKeyProvider,
    FileKeyProvider,
    StaticKeyProvider,
    data_key_context,
    new_data_key,
    uuid7,
)
from agentkeel.client import Keel
from agentkeel.errors import CheckpointConflict, InvalidArgument, PayloadRejected

EDGES = [("queued", "running"), ("running", "done")]


def test_the_env_provider_reads_hex_or_base64_and_refuses_anything_else(monkeypatch):
    key = os.urandom(32)
    monkeypatch.setenv("AK_TEST_KEY", key.hex())
    by_hex = EnvKeyProvider("AK_TEST_KEY")
    monkeypatch.setenv("AK_TEST_KEY", base64.b64encode(key).decode())
    by_base64 = EnvKeyProvider("AK_TEST_KEY")
    assert by_hex.key_id == by_base64.key_id == StaticKeyProvider(key).key_id
    assert key.hex() not in by_hex.key_id
    for bad in ("", "abc", os.urandom(16).hex(), "z" * 64):
        monkeypatch.setenv("AK_TEST_KEY", bad)
        with pytest.raises(ValueError, match="AK_TEST_KEY"):
            EnvKeyProvider("AK_TEST_KEY")


def test_the_file_provider_refuses_a_key_file_others_can_read(tmp_path):
    path = tmp_path / "checkpoint.key"
    key = os.urandom(32)
    path.write_text(key.hex() + "\n")
    path.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        FileKeyProvider(path)
    path.chmod(0o600)
    assert FileKeyProvider(path).key_id == StaticKeyProvider(key).key_id


def test_a_wrapped_data_key_unwraps_only_for_its_tenant_and_its_provider_key():
    provider = StaticKeyProvider(os.urandom(32))
    data_key = new_data_key()
    tenant, other = uuid.uuid4(), uuid.uuid4()
    wrapped = provider.wrap(data_key, data_key_context(tenant))
    assert data_key not in wrapped
    assert provider.unwrap(wrapped, data_key_context(tenant)) == data_key
    with pytest.raises(CheckpointUnreadable):
        provider.unwrap(wrapped, data_key_context(other))
    with pytest.raises(CheckpointUnreadable):
        StaticKeyProvider(os.urandom(32)).unwrap(wrapped, data_key_context(tenant))


def test_client_made_ids_are_time_ordered_uuid_v7():
    ids = [uuid7() for _ in range(50)]
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in ids)
    assert [i.bytes[:6] for i in ids] == sorted(i.bytes[:6] for i in ids)


@pytest.fixture
def world(migrated_db):
    """(client with a key provider, tenant, task id, fencing token)."""
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        keel = Keel(conn, key_provider=StaticKeyProvider(os.urandom(32)))
        keel.define_workflow("ledger", 1, "queued", EDGES)
        tenant = keel.create_tenant("t").tenant_id
        task = keel.create_task(tenant, "ledger", 1)
        token = keel.claim_lease(tenant, task.task_id, "w", timedelta(minutes=5)).fencing_token
        yield keel, tenant, task.task_id, token


def test_a_client_with_another_provider_key_says_so(world):
    keel, tenant, task_id, token = world
    keel.save_checkpoint(tenant, task_id, token, "INPUT", {"q": 1})
    stranger = Keel(keel.conn, key_provider=StaticKeyProvider(os.urandom(32)))
    with pytest.raises(CheckpointUnreadable, match="wrapped by key"):
        stranger.load_latest_checkpoint(tenant, task_id)
    with pytest.raises(ValueError, match="key_provider"):
        Keel(keel.conn).load_latest_checkpoint(tenant, task_id)


def test_saving_a_checkpoint_again_is_idempotent_by_id_and_refuses_another_payload(world):
    keel, tenant, task_id, token = world
    checkpoint_id = uuid7()
    first = keel.save_checkpoint(
        tenant, task_id, token, "INPUT", {"q": 1}, checkpoint_id=checkpoint_id
    )
    args = (tenant, task_id, checkpoint_id, token, "INPUT", first.seq)
    with keel.transaction(tenant) as conn:
        row = conn.execute(
            "select p.key_version, p.nonce, p.ciphertext from keel.checkpoint_payloads as p"
            " where p.tenant_id = %s and p.checkpoint_id = %s",
            (tenant, checkpoint_id),
        ).fetchone()
    key_version, nonce, ciphertext = row
    with keel.transaction(tenant) as conn:
        again = conn.execute(
            "select seq from keel.save_checkpoint(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (*args[:5], key_version, nonce, ciphertext, first.payload_hash),
        ).fetchone()
    assert again == (first.seq,)
    with pytest.raises(CheckpointConflict):
        keel.save_checkpoint(tenant, task_id, token, "INPUT", {"q": 2}, checkpoint_id=checkpoint_id)


def test_the_database_checks_the_hash_nonce_and_size_of_what_it_stores(world, migrated_db):
    keel, tenant, task_id, token = world
    keel.save_checkpoint(tenant, task_id, token, "INPUT", {})  # makes the data key

    def save(nonce: bytes, ciphertext: bytes, payload_hash: str | None = None) -> None:
        with keel.transaction(tenant) as conn:
            conn.execute(
                "select keel.save_checkpoint(%s, %s, %s, %s, 'INPUT', 1, %s, %s, %s)",
                (
                    tenant,
                    task_id,
                    uuid7(),
                    token,
                    nonce,
                    ciphertext,
                    payload_hash or hashlib.sha256(ciphertext).hexdigest(),
                ),
            )

    with pytest.raises(InvalidArgument, match="sha256"):
        save(os.urandom(12), os.urandom(40), "0" * 64)
    with pytest.raises(InvalidArgument, match="nonce"):
        save(os.urandom(8), os.urandom(40))
    with psycopg.connect(migrated_db, autocommit=True) as owner:
        owner.execute(
            "update keel.settings set value = '1000' where setting = 'max_checkpoint_payload_bytes'"
        )
    with pytest.raises(PayloadRejected, match="over the limit of 1000"):
        save(os.urandom(12), os.urandom(1001))
    save(os.urandom(12), os.urandom(1000))
