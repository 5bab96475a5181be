"""G9 Redaction: event payloads refuse secret-bearing keys at any depth, and over-size
payloads, naming the key path and never echoing the value."""

from __future__ import annotations

import pytest

from agentkeel.errors import PayloadRejected
from agentkeel_conformance.harness import tenant_snapshot

pytestmark = pytest.mark.guarantee("G9")

SECRET = "sk-live-DO-NOT-LEAK-1234"
FULLWIDTH_PASSWORD = "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44"  # "password"

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
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_secret_bearing_keys_are_refused_and_nothing_is_written(
    keel, connect, tenant, new_task, case
):
    payload, path = REFUSED[case]
    task = new_task()
    before = tenant_snapshot(connect(), tenant)
    with pytest.raises(PayloadRejected) as info:
        keel.transition_task(tenant, task.task_id, 1, "running", payload=payload)
    text = f"{info.value.message} {info.value.detail} {info.value.hint}"
    assert path in info.value.message
    assert SECRET not in text
    assert tenant_snapshot(connect(), tenant) == before


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_ordinary_keys_are_accepted(keel, tenant, new_task, case):
    task = new_task()
    keel.transition_task(tenant, task.task_id, 1, "running", payload=ACCEPTED[case])
    assert keel.task_events(tenant, task.task_id)[-1].payload == ACCEPTED[case]


def test_an_oversize_payload_is_refused(keel, connect, tenant, new_task):
    limit = int(
        connect()
        .execute("select value from keel.settings where setting = 'max_event_payload_bytes'")
        .fetchone()[0]
    )
    task = new_task()
    before = tenant_snapshot(connect(), tenant)
    with pytest.raises(PayloadRejected) as info:
        keel.transition_task(tenant, task.task_id, 1, "running", payload={"blob": "x" * limit})
    assert f"over the limit of {limit}" in info.value.message
    assert tenant_snapshot(connect(), tenant) == before


def test_the_size_limit_is_a_setting(keel, connect, tenant, new_task, throwaway_database):
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
