"""G9 Redaction: every stored payload (event payloads, outbox messages and their headers,
operation results and errors, task metadata) refuses secret-bearing keys at any depth,
however they are spelled, and over-size or over-deep payloads, naming the key path and
never echoing the value."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from agentkeel.checkpoints import StaticKeyProvider
from agentkeel.client import Keel
from agentkeel.errors import PayloadRejected, QuotaExceeded
from agentkeel.sessions import Sessions
from agentkeel_conformance.connections import suite_connect
from agentkeel_conformance.harness import in_tenant, tenant_snapshot

pytestmark = pytest.mark.guarantee("G9")

SECRET = "sk-live-DO-NOT-LEAK-1234"
FULLWIDTH_PASSWORD = "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44"  # "password"
CYRILLIC_PASSWORD = "p\u0430ssw\u043erd"  # Cyrillic a and o: NFKC leaves them alone
GREEK_TOKEN = "\u03c4\u03bfken"  # Greek tau and omicron
ACCENTED_PASSWORD = "p\u00e1ssw\u00f6rd"
ZERO_WIDTH_SECRET = "se\u200bcret"

REFUSED = {
    "top-level": ({"password": SECRET}, "$.password"),
    "nested": ({"call": {"headers": {"Authorization": SECRET}}}, "$.call.headers.Authorization"),
    "in-array": ({"steps": [{"ok": 1}, {"api_key": SECRET}]}, "$.steps[1].api_key"),
    "camel-case": ({"apiKey": SECRET}, "$.apiKey"),
    "dashed": ({"X-Api-Key": SECRET}, "$.X-Api-Key"),
    "fullwidth-unicode": ({FULLWIDTH_PASSWORD: SECRET}, f"$.{FULLWIDTH_PASSWORD}"),
    "exact-token": ({"token": SECRET}, "$.token"),
    "refresh-token": ({"oauth": {"refresh_token": SECRET}}, "$.oauth.refresh_token"),
    "full-prompt": ({"prompt": SECRET}, "$.prompt"),
    "chat-transcript": ({"messages": [{"role": "user", "content": SECRET}]}, "$.messages"),
    "cookie": ({"Set-Cookie": SECRET}, "$.Set-Cookie"),
    "cyrillic-confusables": ({CYRILLIC_PASSWORD: SECRET}, f"$.{CYRILLIC_PASSWORD}"),
    "greek-confusables": ({GREEK_TOKEN: SECRET}, f"$.{GREEK_TOKEN}"),
    "accents": ({ACCENTED_PASSWORD: SECRET}, f"$.{ACCENTED_PASSWORD}"),
    "zero-width-space": ({ZERO_WIDTH_SECRET: SECRET}, f"$.{ZERO_WIDTH_SECRET}"),
    "id-token": ({"id_token": SECRET}, "$.id_token"),
    "vendor-token": ({"githubToken": SECRET}, "$.githubToken"),
    "jwt": ({"jwt": SECRET}, "$.jwt"),
    "bearer": ({"bearer": SECRET}, "$.bearer"),
    "totp": ({"totp": "123456"}, "$.totp"),
    "pin": ({"PIN": "1234"}, "$.PIN"),
    "cvv": ({"card": {"cvv": "123"}}, "$.card.cvv"),
    "card-number": ({"card_number": "4111111111111111"}, "$.card_number"),
    "access-key": ({"aws_access_key_id": "AKIA..."}, "$.aws_access_key_id"),
    "pwd": ({"db_pwd": SECRET}, "$.db_pwd"),
    "deep": (
        {"a": {"b": {"c": {"d": {"e": {"client_secret": SECRET}}}}}},
        "$.a.b.c.d.e.client_secret",
    ),
}

ACCEPTED = {
    "usage-counters": {"prompt_tokens": 12, "completion_tokens": 30, "max_tokens": 512},
    "plain": {"tool": "search", "query_id": "q-1", "status": "ok"},
    "token-count": {"token_count": 3},
    "secret-looking-value": {"note": "password"},
    "near-misses": {"pinned": True, "footprint": 1, "tokens_used": 3, "spinner": "x"},
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_secret_bearing_keys_are_refused_naming_the_path(keel, connect, tenant, new_task, case):
    """Mutation: keys_unchecked."""
    payload, path = REFUSED[case]
    task = new_task()
    with pytest.raises(PayloadRejected) as info:
        keel.transition_task(tenant, task.task_id, 1, "running", payload=payload)
    text = f"{info.value.message} {info.value.detail} {info.value.hint}"
    assert path in info.value.message
    assert SECRET not in text


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_ordinary_keys_are_accepted(keel, tenant, new_task, case):
    """No mutation: a positive control; the refusals are what planted bugs break."""
    task = new_task()
    keel.transition_task(tenant, task.task_id, 1, "running", payload=ACCEPTED[case])
    assert keel.task_events(tenant, task.task_id)[-1].payload == ACCEPTED[case]


def test_an_oversize_payload_is_refused(keel, connect, tenant, new_task):
    """No mutation: check_payload's size check has no planted bug yet."""
    limit = int(
        connect()
        .execute("select value from keel.settings where setting = 'max_event_payload_bytes'")
        .fetchone()[0]
    )
    task = new_task()
    with pytest.raises(PayloadRejected) as info:
        keel.transition_task(tenant, task.task_id, 1, "running", payload={"blob": "x" * limit})
    assert f"over the limit of {limit}" in info.value.message


def test_the_size_limit_is_a_setting(keel, connect, tenant, new_task, throwaway_database):
    """No mutation: check_payload's size check has no planted bug yet."""
    if not throwaway_database:
        pytest.skip("changing keel.settings affects every tenant: embedded cluster only")
    conn = connect(owner=True)
    conn.execute("update keel.settings set value = '100' where setting = 'max_event_payload_bytes'")
    try:
        task = new_task()
        with pytest.raises(PayloadRejected):
            keel.transition_task(tenant, task.task_id, 1, "running", payload={"blob": "x" * 100})
    finally:
        conn.execute(
            "update keel.settings set value = '65536' where setting = 'max_event_payload_bytes'"
        )


# Every place a caller's JSON is stored, each refusing the same way.
SINKS: dict[str, Callable[[Keel, uuid.UUID, Any, dict[str, Any]], Any]] = {
    "event payload": lambda k, t, task, p: k.transition_task(
        t, task.task_id, 1, "running", payload=p
    ),
    "outbox message payload": lambda k, t, task, p: k.transition_task(
        t, task.task_id, 1, "running", outbox=[{"topic": "t", "payload": p}]
    ),
    "outbox message headers": lambda k, t, task, p: k.transition_task(
        t, task.task_id, 1, "running", outbox=[{"topic": "t", "headers": p}]
    ),
    "operation result": lambda k, t, task, p: k.complete_operation(
        t, k.reserve_operation(t, None, "op", "a", "h").operation_id, None, p
    ),
    "operation error": lambda k, t, task, p: k.fail_operation(
        t, k.reserve_operation(t, None, "op", "a", "h").operation_id, None, p
    ),
    "task metadata": lambda k, t, task, p: k.create_task(
        t, task.workflow, task.workflow_version, metadata=p
    ),
}


@pytest.mark.parametrize("sink", sorted(SINKS))
def test_every_stored_payload_refuses_secret_bearing_keys(keel, tenant, new_task, sink):
    """Mutation: keys_unchecked; also outbox_unchecked, result_unchecked (their sinks)."""
    with pytest.raises(PayloadRejected) as info:
        SINKS[sink](keel, tenant, new_task(), {"nested": {"Authorization": SECRET}})
    assert "nested.Authorization" in info.value.message and sink.split()[0] in info.value.message
    assert SECRET not in f"{info.value.message} {info.value.detail} {info.value.hint}"


@pytest.mark.parametrize("sink", sorted(SINKS))
def test_every_stored_payload_has_a_size_limit(keel, tenant, new_task, sink):
    """No mutation: check_payload's size check has no planted bug yet."""
    with pytest.raises(PayloadRejected) as info:
        SINKS[sink](keel, tenant, new_task(), {"blob": "x" * 70_000})
    assert "over the limit of" in info.value.message


@pytest.mark.parametrize("sink", sorted(SINKS))
def test_every_stored_payload_accepts_ordinary_keys(keel, tenant, new_task, sink):
    """No mutation: a positive control; the refusals are what planted bugs break."""
    SINKS[sink](keel, tenant, new_task(), {"tool": "search", "max_tokens": 512})


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def nested_text(depth: int) -> str:
    return '{"a":' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"


def test_payloads_nested_up_to_the_limit_are_accepted(keel, tenant, new_task):
    """No mutation: a positive control at the depth limit."""
    keel.transition_task(tenant, new_task().task_id, 1, "running", payload=nested(64))


@pytest.mark.parametrize("depth", [65, 10_000])
def test_payloads_nested_deeper_than_the_limit_are_refused_before_any_other_work(
    keel, tenant, new_task, depth
):
    """10,000 nested arrays in 20 KB once cost seconds of CPU in the key walk; the depth check
    runs first of the payload checks, which run once the task has been looked up.
    Mutation: depth_unchecked."""
    task = new_task()
    with pytest.raises(PayloadRejected) as info, keel.transaction(tenant) as conn:
        conn.execute(
            "select keel.transition_task(%s, %s, 1, 'running', p_payload => %s::jsonb)",
            (tenant, task.task_id, nested_text(depth)),
        )
    assert "nests deeper than 64 levels" in info.value.message


# Numbers past what an IEEE 754 double holds: Python's json refuses the first, others fail
# on or read Infinity for the rest (issue 23: one such payload stopped the relay for every
# tenant). Sent as JSON text: no Python value encodes them.
UNREADABLE_NUMBERS = {
    "5000 digits": "9" * 5000,
    "past the largest double": "1e400",
    "past the largest negative double": "-1.8e308",
    "below the smallest normal double": "1e-400",
}
READABLE_NUMBERS = ["0", "-0.0", "1.7976931348623157e308", "2.2250738585072014e-308", "9" * 300]


@pytest.mark.parametrize("case", sorted(UNREADABLE_NUMBERS))
@pytest.mark.parametrize("where", ["payload", "outbox payload", "outbox headers"])
def test_numbers_no_double_can_hold_are_refused(keel, tenant, new_task, case, where):
    """Mutation: numbers_unchecked."""
    number = UNREADABLE_NUMBERS[case]
    document = f'{{"deep": [{{"n": {number}}}]}}'
    payload, outbox = "{}", "[]"
    if where == "payload":
        payload = document
    elif where == "outbox payload":
        outbox = f'[{{"topic": "t", "payload": {document}}}]'
    else:
        outbox = f'[{{"topic": "t", "headers": {document}}}]'
    task = new_task()
    with pytest.raises(PayloadRejected) as info, keel.transaction(tenant) as conn:
        conn.execute(
            "select keel.transition_task(%s, %s, 1, 'running',"
            " p_payload => %s::jsonb, p_outbox => %s::jsonb)",
            (tenant, task.task_id, payload, outbox),
        )
    assert "no IEEE 754 double can hold" in info.value.message
    assert number not in f"{info.value.message} {info.value.detail} {info.value.hint}"


def test_numbers_a_double_holds_are_accepted(keel, tenant, new_task):
    """No mutation: a positive control at the bounds of the number check."""
    task = new_task()
    with keel.transaction(tenant) as conn:
        conn.execute(
            "select keel.transition_task(%s, %s, 1, 'running', p_payload => %s::jsonb)",
            (tenant, task.task_id, f'{{"numbers": [{", ".join(READABLE_NUMBERS)}]}}'),
        )


def test_a_transition_writes_at_most_the_set_number_of_outbox_messages(
    keel, connect, tenant, new_task
):
    """One message over settings.max_transition_messages refuses the whole transition,
    before the task is touched: one call cannot queue any number of messages.
    Mutation: transition_messages_unbounded."""
    limit = int(
        connect()
        .execute("select value from keel.settings where setting = 'max_transition_messages'")
        .fetchone()[0]
    )
    task = new_task()
    with pytest.raises(PayloadRejected) as info:
        keel.transition_task(
            tenant, task.task_id, 1, "running", outbox=[{"topic": "t"}] * (limit + 1)
        )
    assert f"at most {limit} outbox messages" in info.value.message
    assert keel.get_task(tenant, task.task_id).state_version == 1


@pytest.mark.parametrize("limit", ["updates", "bytes"])
def test_a_session_takes_step_updates_up_to_its_quota_and_then_none(connect, tenant, limit):
    """keel.load_session folds every update of a session, so a session's updates are
    bounded: settings.max_session_updates updates and settings.max_session_total_update_bytes
    bytes of results and errors. The update that would pass either is refused with
    quota_exceeded (54K01) and writes nothing; the session still loads. (The owner sets
    the session's counters near the limit, as if it had taken that many updates: the
    defaults are 10,000 updates and 16 MiB.)
    No mutation: the generated mutants disable each quota check (tests/test_mutants.py)."""
    sessions = Sessions(connect())
    session_id = f"quota-{uuid.uuid4().hex[:8]}"
    sessions.save(tenant, session_id, {"turn": 0})
    owner = connect(owner=True)
    (max_updates, max_bytes) = owner.execute(
        "select"
        " max(value::bigint) filter (where setting = 'max_session_updates'),"
        " max(value::bigint) filter (where setting = 'max_session_total_update_bytes')"
        " from keel.settings"
    ).fetchone()
    result = {"text": "x" * 20}
    size = len(json.dumps(result))  # jsonb's text: {"text": "xxx..."}, as stored
    with in_tenant(owner, tenant):
        owner.execute(
            "update keel.sessions set last_update_seq = %s, update_bytes = %s"
            " where tenant_id = %s and session_id = %s",
            (
                max_updates - 2 if limit == "updates" else 0,
                max_bytes - 2 * size if limit == "bytes" else 0,
                tenant,
                session_id,
            ),
        )
    for step in ("a", "b"):  # the last two the quota allows
        sessions.update(tenant, session_id, step, "completed", result=result)
    before = tenant_snapshot(owner, tenant)
    with pytest.raises(QuotaExceeded) as info:
        sessions.update(tenant, session_id, "c", "completed", result=result)
    assert info.value.sqlstate == "54K01"
    assert tenant_snapshot(owner, tenant) == before, "a refused update wrote something"
    loaded = sessions.load(tenant, session_id)
    assert loaded is not None and set(loaded.steps) == {"a", "b"}


def set_quota(owner: Any, tenant: uuid.UUID, setting: str, value: int | None) -> None:
    """The owner's keel.set_tenant_quota, a call of its own (autocommit: it acts for the
    tenant it names, and on Citus runs on that tenant's node)."""
    owner.execute("select keel.set_tenant_quota(%s, %s, %s)", (tenant, setting, value))


def test_a_tenant_writes_pending_messages_up_to_its_own_quota_and_then_none(
    connect, keel, make_tenant, workflow
):
    """The owner gives tenant A a limit of its own: 5 pending outbox messages
    (keel.set_tenant_quota; the default for every tenant, settings.max_tenant_pending_messages,
    is 100,000). A's transitions write 3 messages, then 2; the next, with 1 more, is refused
    with quota_exceeded (54K01) and writes nothing, not even its event. Tenant B, without a
    limit of its own, writes 6 at once. With A's limit removed by the owner, A writes again.
    No mutation: the generated mutants disable each quota check (tests/test_mutants.py)."""
    a, b = make_tenant(), make_tenant()
    owner = connect(owner=True)
    set_quota(owner, a, "max_tenant_pending_messages", 5)

    def transition(tenant: uuid.UUID, messages: int) -> None:
        task = keel.create_task(tenant, workflow.name, workflow.version)
        keel.transition_task(
            tenant, task.task_id, 1, "running", outbox=[{"topic": "quota"}] * messages
        )

    transition(a, 3)
    transition(a, 2)
    task = keel.create_task(a, workflow.name, workflow.version)
    before = tenant_snapshot(owner, a)
    with pytest.raises(QuotaExceeded) as info:
        keel.transition_task(a, task.task_id, 1, "running", outbox=[{"topic": "quota"}])
    assert info.value.sqlstate == "54K01"
    assert "pending outbox messages" in info.value.message
    assert tenant_snapshot(owner, a) == before, "a refused transition wrote something"
    transition(b, 6)
    set_quota(owner, a, "max_tenant_pending_messages", None)
    keel.transition_task(a, task.task_id, 1, "running", outbox=[{"topic": "quota"}])


def test_the_pending_message_quota_counts_again_what_the_owner_removed_by_hand(
    connect, keel, make_tenant, workflow
):
    """A tenant's pending messages are kept on a counter as they are written and settled
    (keel.pending_message_counts), and counted again whenever the counter would refuse a
    write. With a limit of 3 and 3 pending, the owner deletes two of them by hand (no
    function takes them off the counter); a transition with 2 more is then accepted, and
    one with 1 more after it is refused with quota_exceeded (54K01).
    Mutation: pending_count_never_recounted."""
    tenant = make_tenant()
    owner = connect(owner=True)
    set_quota(owner, tenant, "max_tenant_pending_messages", 3)

    def transition(messages: int) -> None:
        task = keel.create_task(tenant, workflow.name, workflow.version)
        keel.transition_task(
            tenant, task.task_id, 1, "running", outbox=[{"topic": "quota"}] * messages
        )

    transition(3)
    with in_tenant(owner, tenant):
        owner.execute("delete from keel.outbox where tenant_id = %s and position <= 2", (tenant,))
    transition(2)
    with pytest.raises(QuotaExceeded) as info:
        transition(1)
    assert info.value.sqlstate == "54K01"
    set_quota(owner, tenant, "max_tenant_pending_messages", None)


def test_a_task_saves_checkpoints_and_opens_step_attempts_up_to_its_quota(
    connect, keel, tenant, new_task
):
    """The owner gives the tenant limits of its own: 2 checkpoints and 2 step attempts a
    task (defaults 10,000 each). A task saves two checkpoints and opens two steps; the
    third of each is refused with quota_exceeded (54K01) and writes nothing. Beginning a
    step that is already open is no new attempt, and is still answered.
    No mutation: the generated mutants disable each quota check (tests/test_mutants.py)."""
    owner = connect(owner=True)
    set_quota(owner, tenant, "max_task_checkpoints", 2)
    set_quota(owner, tenant, "max_task_step_attempts", 2)
    ledger = Keel(connect(), key_provider=StaticKeyProvider(os.urandom(32)))
    task = new_task()
    token = ledger.claim_lease(tenant, task.task_id, "quota", timedelta(minutes=5)).fencing_token
    for n in (1, 2):
        ledger.save_checkpoint(tenant, task.task_id, token, "INPUT", {"n": n})
        keel.begin_step(tenant, task.task_id, f"step-{n}", "0" * 64, token)
    before = tenant_snapshot(owner, tenant)
    with pytest.raises(QuotaExceeded) as info:
        ledger.save_checkpoint(tenant, task.task_id, token, "INPUT", {"n": 3})
    assert "checkpoints of task" in info.value.message
    with pytest.raises(QuotaExceeded) as info:
        keel.begin_step(tenant, task.task_id, "step-3", "0" * 64, token)
    assert "step attempts of task" in info.value.message
    assert tenant_snapshot(owner, tenant) == before, "a refused save or step wrote something"
    again = keel.begin_step(tenant, task.task_id, "step-1", "0" * 64, token)
    assert again.outcome == "in_progress"


def test_a_tenant_holds_checkpoint_bytes_up_to_its_quota_and_a_purge_gives_them_back(
    connect, keel, make_tenant, workflow
):
    """A checkpoint holds up to 16 MiB and a task may save 10,000, so the tenant's bytes
    have a limit of their own (settings.max_tenant_checkpoint_bytes, 10 GiB). The owner
    gives tenant A room for two and a half checkpoints: two are stored, the third is
    refused with quota_exceeded (54K01) and writes nothing, not even its usage. Tenant B
    saves three. When A invalidates one and a purge (retention 0 for old checkpoints)
    removes it, its bytes are A's again and the third is stored.
    Mutation: checkpoint_bytes_unchecked; also purge_credits_nothing"""
    a, b = make_tenant(), make_tenant()
    owner = connect(owner=True)
    ledger = Keel(connect(), key_provider=StaticKeyProvider(os.urandom(32)))

    def leased(tenant: uuid.UUID) -> tuple[uuid.UUID, int]:
        task = keel.create_task(tenant, workflow.name, workflow.version)
        lease = ledger.claim_lease(tenant, task.task_id, "bytes", timedelta(minutes=5))
        return task.task_id, lease.fencing_token

    task, token = leased(a)
    first = ledger.save_checkpoint(a, task, token, "INPUT", {"n": 1})
    with in_tenant(owner, a):
        (size,) = owner.execute(
            "select octet_length(ciphertext) from keel.checkpoint_payloads"
            " where tenant_id = %s and checkpoint_id = %s",
            (a, first.checkpoint_id),
        ).fetchone()
    set_quota(owner, a, "max_tenant_checkpoint_bytes", 2 * size + size // 2)
    ledger.save_checkpoint(a, task, token, "INPUT", {"n": 2})
    before = tenant_snapshot(owner, a)
    with pytest.raises(QuotaExceeded) as info:
        ledger.save_checkpoint(a, task, token, "INPUT", {"n": 3})
    assert info.value.sqlstate == "54K01"
    assert "checkpoint bytes of tenant" in info.value.message
    assert tenant_snapshot(owner, a) == before, "a refused save wrote something"
    other, other_token = leased(b)
    for n in (1, 2, 3):
        ledger.save_checkpoint(b, other, other_token, "INPUT", {"n": n})

    ledger.invalidate_checkpoint(a, first.checkpoint_id, token)
    owner.execute("select keel.set_tenant_retention(%s, 'retain_old_checkpoints', '0')", (a,))
    removed = owner.execute("select relation, removed from keel.purge(%s, 100)", (a,)).fetchall()
    assert ("keel.checkpoint_payloads", 1) in removed, removed
    ledger.save_checkpoint(a, task, token, "INPUT", {"n": 3})


def test_a_tenant_holds_sessions_up_to_its_quota_and_then_none(connect, make_tenant):
    """Each session's updates are bounded, and so is the number of a tenant's sessions
    (settings.max_tenant_sessions, 100,000, active or closed): with its own limit of 2,
    tenant A saves two sessions, and a save that would create a third is refused with
    quota_exceeded (54K01) and writes nothing. A's sessions still take new snapshots, and
    tenant B saves three.
    Mutation: sessions_unbounded"""
    a, b = make_tenant(), make_tenant()
    owner = connect(owner=True)
    set_quota(owner, a, "max_tenant_sessions", 2)
    sessions = Sessions(connect())
    for n in (1, 2):
        sessions.save(a, f"quota-{n}", {"turn": 0})
    before = tenant_snapshot(owner, a)
    with pytest.raises(QuotaExceeded) as info:
        sessions.save(a, "quota-3", {"turn": 0})
    assert info.value.sqlstate == "54K01"
    assert "sessions of tenant" in info.value.message
    assert tenant_snapshot(owner, a) == before, "a refused save wrote something"
    assert sessions.save(a, "quota-1", {"turn": 1}).state_version == 2
    for n in (1, 2, 3):
        sessions.save(b, f"quota-{n}", {"turn": 0})


@pytest.mark.parametrize("role", ["keel_app", "keel_worker", "keel_agent", "keel_relay"])
def test_no_application_login_may_set_a_tenants_quota(login_role, tenant, role):
    """keel.set_tenant_quota is the owner's alone: an agent or an application could
    otherwise lift its own limits.
    No mutation: a grant, which agentkeel check's shipped-grants rule compares."""
    conn = suite_connect(login_role(role).dsn, autocommit=True)
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "select keel.set_tenant_quota(%s, 'max_task_checkpoints', 1000000)", (tenant,)
            )
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("setting", "value", "sqlstate"),
    [
        ("max_session_updates", 5, "22K01"),  # not a per-tenant quota
        ("max_task_checkpoints", -1, "22K01"),
        ("max_task_checkpoints", 10**10, "22K01"),
        ("max_tenant_sessions", 10**10, "22K01"),
        ("max_tenant_checkpoint_bytes", 2**50 + 1, "22K01"),
        ("for_another_tenant", 5, "42K06"),
    ],
)
def test_a_tenant_quota_the_owner_sets_is_checked(connect, make_tenant, setting, value, sqlstate):
    """keel.set_tenant_quota takes only the per-tenant quotas, counts of 0 to 1,000,000,000
    and bytes up to 1 PiB, for the tenant the transaction acts for; anything else is
    refused and writes nothing.
    No mutation: the generated mutants disable each of these guards (tests/test_mutants.py)."""
    tenant, other = make_tenant(), make_tenant()
    owner = connect(owner=True)
    named = other if setting == "for_another_tenant" else tenant
    setting = "max_task_checkpoints" if setting == "for_another_tenant" else setting
    with pytest.raises(psycopg.Error) as info, in_tenant(owner, tenant):
        owner.execute("select keel.set_tenant_quota(%s, %s, %s)", (named, setting, value))
    assert info.value.sqlstate == sqlstate
    for each in (tenant, other):
        # Filtered by tenant, not left to row-level security: a superuser owner bypasses it
        # and would count the quotas of tests running beside this one.
        with in_tenant(owner, each):
            query = "select count(*) from keel.tenant_quotas where tenant_id = %s"
            assert owner.execute(query, (each,)).fetchone() == (0,)
