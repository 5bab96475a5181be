"""G8 checkpoints (with G9, G10): typed recovery points whose payloads the database holds
only as AES-GCM ciphertext under a wrapped per-tenant data key.

A worker resumes from the latest valid checkpoint (status ok, not expired); a ciphertext
moved to another row does not decrypt (the ids are associated data); no table holds the
plaintext or the data key; destroying the tenant's data keys makes its payloads unreadable.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from agentkeel.checkpoints import CheckpointUnreadable, StaticKeyProvider, data_key_context
from agentkeel.client import Keel
from agentkeel.errors import DataKeyDestroyed, InvalidArgument, KeelError, LeaseLost
from agentkeel_conformance.harness import in_tenant, tenant_snapshot

pytestmark = pytest.mark.guarantee("G8")


@pytest.fixture
def provider():
    return StaticKeyProvider(os.urandom(32))


@pytest.fixture
def ledger(connect, provider):
    """The client with a checkpoint key provider."""
    return Keel(connect(), key_provider=provider)


@pytest.fixture
def leased(ledger, tenant, new_task):
    task = new_task()
    claimed = ledger.claim_lease(tenant, task.task_id, "worker-a", timedelta(minutes=5))
    return task.task_id, claimed.fencing_token


def test_the_latest_valid_checkpoint_is_loaded_and_decrypted(ledger, tenant, leased):
    """Newest first; an invalidated or expired checkpoint is skipped; kinds filter.

    No mutation: loading has no planted bug; the crash run in test_g8_steps resumes from it"""
    task_id, token = leased
    assert ledger.load_latest_checkpoint(tenant, task_id) is None
    ledger.save_checkpoint(tenant, task_id, token, "INPUT", {"question": "q"})
    tool = ledger.save_checkpoint(
        tenant, task_id, token, "TOOL_RESULT", {"rows": [1, 2]}, schema_version=2
    )
    synthesis = ledger.save_checkpoint(tenant, task_id, token, "SYNTHESIS", {"draft": "d"})
    ledger.save_checkpoint(
        tenant, task_id, token, "DELIVERY", {"sent": True}, ttl=timedelta(milliseconds=1)
    )
    time.sleep(0.01)

    latest = ledger.load_latest_checkpoint(tenant, task_id)
    assert latest is not None
    assert (latest.checkpoint.checkpoint_id, latest.payload) == (
        synthesis.checkpoint_id,
        {"draft": "d"},
    )
    ledger.invalidate_checkpoint(tenant, synthesis.checkpoint_id, token)
    latest = ledger.load_latest_checkpoint(tenant, task_id)
    assert latest is not None
    assert (latest.checkpoint.kind, latest.checkpoint.schema_version, latest.payload) == (
        "TOOL_RESULT",
        2,
        {"rows": [1, 2]},
    )
    assert latest.checkpoint.seq == tool.seq == 2
    first = ledger.load_latest_checkpoint(tenant, task_id, kind="INPUT")
    assert first is not None and first.payload == {"question": "q"}
    # Workflow-defined kinds have one form; anything else is refused.
    ledger.save_checkpoint(tenant, task_id, token, "PLAN_V2", {})
    with pytest.raises(InvalidArgument):
        ledger.save_checkpoint(tenant, task_id, token, "plan; drop", {})


@pytest.mark.guarantee("G5")
def test_a_stale_token_cannot_save_a_checkpoint(ledger, tenant, new_task):
    """Saving is fenced by the lease: after a takeover the old token is refused.

    No mutation: fenced by the shared keel.assert_lease, which the G5 tests break for all"""
    task = new_task()
    old = ledger.claim_lease(tenant, task.task_id, "worker-a", timedelta(milliseconds=200))
    time.sleep(0.3)
    ledger.claim_lease(tenant, task.task_id, "worker-b", timedelta(minutes=5))
    with pytest.raises(LeaseLost):
        ledger.save_checkpoint(tenant, task.task_id, old.fencing_token, "SYNTHESIS", {"x": 1})
    assert ledger.load_latest_checkpoint(tenant, task.task_id) is None


def owner_rows(owner, tenant, query, *params):
    with in_tenant(owner, tenant):
        return owner.execute(query, params).fetchall()


@pytest.mark.guarantee("G9")
def test_no_table_holds_a_plaintext_payload_or_a_key(connect, ledger, provider, tenant, leased):
    """Every text, json, jsonb and bytea column of every keel table is scanned for the
    payload's marker and for the data key (raw bytes, hex, base64).

    No mutation: the encryption is in the client; no function edit can put plaintext in"""
    task_id, token = leased
    marker = f"PLAINTEXT-MARKER-{uuid.uuid4().hex}"
    ledger.save_checkpoint(tenant, task_id, token, "SYNTHESIS", {"secret_plan": marker})
    ledger.save_checkpoint(tenant, task_id, token, "TOOL_RESULT", {"note": marker * 50})
    owner = connect(owner=True)
    ((wrapped,),) = owner_rows(
        owner, tenant, "select wrapped_key from keel.tenant_data_keys where tenant_id = %s", tenant
    )
    data_key = provider.unwrap(bytes(wrapped), data_key_context(tenant))
    needles_text = [marker, data_key.hex(), base64.b64encode(data_key).decode()]
    needles_bytes = [marker.encode(), data_key]

    columns = owner.execute(
        """
        select c.oid::regclass::text, a.attname, format_type(a.atttypid, null)
        from pg_catalog.pg_class as c
        join pg_catalog.pg_namespace as n on n.oid = c.relnamespace
        join pg_catalog.pg_attribute as a on a.attrelid = c.oid
        where n.nspname = 'keel' and c.relkind in ('r', 'p') and a.attnum > 0
            and not a.attisdropped
            and format_type(a.atttypid, null) in ('text', 'character varying', 'json',
                'jsonb', 'bytea', 'name', 'text[]')
        order by 1, 2
        """
    ).fetchall()
    scanned = {table for table, _, _ in columns}
    assert {"keel.checkpoint_payloads", "keel.checkpoints", "keel.tenant_data_keys"} <= scanned
    found = []
    with in_tenant(owner, tenant):
        for table, column, type_name in columns:
            ident = sql.Identifier(*table.split("."))
            col = sql.Identifier(column)
            if type_name == "bytea":
                for needle in needles_bytes:
                    query = sql.SQL("select count(*) from {} where position(%s in {}) > 0")
                    (n,) = owner.execute(query.format(ident, col), (needle,)).fetchone()
                    found += [(table, column)] * n
            else:
                for needle in needles_text:
                    query = sql.SQL("select count(*) from {} where strpos({}::text, %s) > 0")
                    (n,) = owner.execute(query.format(ident, col), (needle,)).fetchone()
                    found += [(table, column)] * n
    assert found == []
    # The scan can see: the same query finds the marker where it is stored in plain text.
    ledger.transition_task(tenant, task_id, 1, "running", fencing_token=token,
                           payload={"note": marker})  # fmt: skip
    with in_tenant(owner, tenant):
        (n,) = owner.execute(
            "select count(*) from keel.task_events where strpos(payload::text, %s) > 0",
            (marker,),
        ).fetchone()
    assert n == 1


def test_a_ciphertext_moved_to_another_row_does_not_decrypt(
    connect, ledger, tenant, leased, new_task
):
    """The owner copies one checkpoint's payload (nonce, ciphertext, hash) onto another
    task's checkpoint: loading it fails, since the ids are the associated data.

    No mutation: the binding is in the client's AES-GCM, not in a function"""
    task_id, token = leased
    other = new_task()
    other_token = ledger.claim_lease(
        tenant, other.task_id, "worker-a", timedelta(minutes=5)
    ).fencing_token
    source = ledger.save_checkpoint(tenant, task_id, token, "SYNTHESIS", {"mine": 1})
    target = ledger.save_checkpoint(tenant, other.task_id, other_token, "SYNTHESIS", {"x": 2})
    owner = connect(owner=True)
    with in_tenant(owner, tenant):
        owner.execute(
            "update keel.checkpoint_payloads as t set nonce = s.nonce, ciphertext = s.ciphertext"
            " from keel.checkpoint_payloads as s"
            " where t.tenant_id = %s and s.tenant_id = %s"
            " and t.checkpoint_id = %s and s.checkpoint_id = %s",
            (tenant, tenant, target.checkpoint_id, source.checkpoint_id),
        )
        owner.execute(
            "update keel.checkpoints set payload_hash = %s"
            " where tenant_id = %s and checkpoint_id = %s",
            (source.payload_hash, tenant, target.checkpoint_id),
        )
    with pytest.raises(CheckpointUnreadable, match="another row"):
        ledger.load_latest_checkpoint(tenant, other.task_id)
    mine = ledger.load_latest_checkpoint(tenant, task_id)
    assert mine is not None and mine.payload == {"mine": 1}


def test_destroying_the_tenants_data_keys_makes_its_payloads_unreadable(
    connect, ledger, provider, tenant, make_tenant, leased, workflow
):
    """G10's crypto-shredding, for checkpoints alone (tenant deletion as a whole:
    test_g10_tenant_deletion.py). The owner destroys the keys: the wrapped key is gone,
    loading raises data_key_destroyed, and the ciphertext left behind does not decrypt
    with anything the database holds. Another tenant is untouched; a new save uses a new
    key version.

    No mutation: one owner-only UPDATE; the test checks that nothing else keeps the key"""
    task_id, token = leased
    ledger.save_checkpoint(tenant, task_id, token, "SYNTHESIS", {"plan": "p"})
    neighbour = make_tenant()
    ntask = ledger.create_task(neighbour, workflow.name, workflow.version)
    ntoken = ledger.claim_lease(neighbour, ntask.task_id, "w", timedelta(minutes=5)).fencing_token
    ledger.save_checkpoint(neighbour, ntask.task_id, ntoken, "SYNTHESIS", {"plan": "n"})

    owner = Keel(connect(owner=True))
    assert owner.destroy_tenant_data_keys(tenant) == 1
    with pytest.raises(DataKeyDestroyed):
        ledger.load_latest_checkpoint(tenant, task_id)
    rows = owner_rows(
        owner.conn,
        tenant,
        "select wrapped_key, destroyed_at is not null from keel.tenant_data_keys"
        " where tenant_id = %s",
        tenant,
    )
    assert rows == [(None, True)]
    (payloads,) = owner_rows(
        owner.conn,
        tenant,
        "select count(*) from keel.checkpoint_payloads where tenant_id = %s",
        tenant,
    )
    assert payloads == (1,)  # ciphertext remains, and nothing can open it

    loaded = ledger.load_latest_checkpoint(neighbour, ntask.task_id)
    assert loaded is not None and loaded.payload == {"plan": "n"}
    fresh = ledger.save_checkpoint(tenant, task_id, token, "SYNTHESIS", {"plan": "again"})
    reloaded = ledger.load_latest_checkpoint(tenant, task_id)
    assert reloaded is not None
    assert (reloaded.checkpoint.checkpoint_id, reloaded.payload) == (
        fresh.checkpoint_id,
        {"plan": "again"},
    )
    ((version,),) = owner_rows(
        owner.conn,
        tenant,
        "select max(key_version) from keel.tenant_data_keys where tenant_id = %s",
        tenant,
    )
    assert version == 2


SAVE = (
    "select * from keel.save_checkpoint(%(tenant)s, %(task)s, %(id)s, %(token)s, %(kind)s,"
    " %(version)s, %(nonce)s, %(ciphertext)s, %(hash)s, %(schema)s, %(step)s)"
)
HUGE = 16 * 1024 * 1024 + 1  # past the default max_checkpoint_payload_bytes


def key_version(owner: psycopg.Connection, tenant: uuid.UUID) -> int:
    with in_tenant(owner, tenant):
        row = owner.execute(
            "select max(key_version) from keel.tenant_data_keys where tenant_id = %s", (tenant,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def _refused_saves() -> list[Any]:
    return [
        pytest.param({"id": None}, "22K01", id="no_id"),
        pytest.param({"kind": "plan; drop"}, "22K01", id="kind"),
        pytest.param({"schema": 0}, "22K01", id="schema_version"),
        pytest.param({"step": ""}, "22K01", id="step_key"),
        pytest.param({"nonce": b"short"}, "22K01", id="nonce"),
        pytest.param({"ciphertext": b"x" * 15}, "22K01", id="ciphertext"),
        pytest.param({"ciphertext": b"x" * HUGE}, "22K02", id="too_large"),
        pytest.param({"hash": "0" * 64}, "22K01", id="hash"),
        pytest.param({"version": 999}, "42K11", id="no_such_key"),
        pytest.param({"id": "saved"}, "23K10", id="id_taken"),
    ]


@pytest.mark.parametrize(("change", "sqlstate"), _refused_saves())
def test_a_malformed_save_is_refused_by_the_database_and_writes_nothing(
    connect, ledger, tenant, leased, change, sqlstate
):
    """What the client always sends right, sent wrong by SQL: a save without an id, with a
    malformed kind, schema version, step key, nonce or ciphertext, a ciphertext past
    settings.max_checkpoint_payload_bytes, a hash that is not the ciphertext's, a key
    version the tenant does not have, or the id of a stored checkpoint with another
    payload: each is refused with its SQLSTATE and writes nothing.
    No mutation: the generated mutants disable each of these guards (tests/test_mutants.py)."""
    task_id, token = leased
    saved = ledger.save_checkpoint(tenant, task_id, token, "INPUT", {"n": 1})
    owner = connect(owner=True)
    ciphertext = change.get("ciphertext", os.urandom(32))
    args = {
        "tenant": tenant,
        "task": task_id,
        "id": uuid.uuid4(),
        "token": token,
        "kind": "INPUT",
        "version": key_version(owner, tenant),
        "nonce": os.urandom(12),
        "hash": hashlib.sha256(ciphertext).hexdigest(),
        "schema": 1,
        "step": None,
        **change,
        "ciphertext": ciphertext,
    }
    if args["id"] == "saved":
        args["id"] = saved.checkpoint_id
    before = tenant_snapshot(owner, tenant)
    with pytest.raises(KeelError) as info, ledger.transaction(tenant):
        ledger.conn.execute(SAVE, args)
    assert info.value.sqlstate == sqlstate
    assert tenant_snapshot(owner, tenant) == before


def test_a_save_with_a_destroyed_key_is_refused(connect, ledger, tenant, leased):
    """A key version the owner destroyed encrypts nothing more: data_key_destroyed (55K10).
    No mutation: the generated mutants disable this guard (tests/test_mutants.py)."""
    task_id, token = leased
    ledger.save_checkpoint(tenant, task_id, token, "INPUT", {"n": 1})
    owner = connect(owner=True)
    version = key_version(owner, tenant)
    Keel(owner).destroy_tenant_data_keys(tenant)
    ciphertext = os.urandom(32)
    with pytest.raises(DataKeyDestroyed), ledger.transaction(tenant):
        ledger.conn.execute(
            SAVE,
            {
                "tenant": tenant,
                "task": task_id,
                "id": uuid.uuid4(),
                "token": token,
                "kind": "INPUT",
                "version": version,
                "nonce": os.urandom(12),
                "ciphertext": ciphertext,
                "hash": hashlib.sha256(ciphertext).hexdigest(),
                "schema": 1,
                "step": None,
            },
        )
