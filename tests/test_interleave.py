"""The interleaving runner: its grammar, its permutations, and that it catches real bugs."""

from __future__ import annotations

import dataclasses
import re

import psycopg
import pytest

from agentkeel.client import Keel
from agentkeel_conformance.fixtures import EDGES
from agentkeel_conformance.interleave import (
    Runner,
    SpecError,
    Step,
    expected_output,
    load_specs,
    parse_spec,
)
from agentkeel_conformance.mutations import BY_NAME
from conftest import REPO

TWO_SESSIONS = """
# guarantee: G2
session a
step a1 { select '{not a placeholder}' }
step a2 { select 2 }
session b
step b1 { select 3 }
"""


def test_unlisted_permutations_are_every_order_keeping_each_session():
    spec = parse_spec(TWO_SESSIONS)
    assert spec.guarantees == ["G2"]
    assert spec.all_permutations() == [["a1", "a2", "b1"], ["a1", "b1", "a2"], ["b1", "a1", "a2"]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("session a\nstep a1 { select 1\nsession b\nstep b1 { select 1 }", "unbalanced"),
        (TWO_SESSIONS + "permutation a1 zz\n", "unknown step zz"),
        ("session a\nstep a1 { select 1 }\n", "at least two sessions"),
        ("bogus\n", "unexpected text"),
    ],
)
def test_malformed_specs_are_refused(text, message):
    with pytest.raises(SpecError, match=message):
        parse_spec(text)


def test_every_shipped_spec_has_an_expected_transcript():
    for spec in load_specs():
        assert expected_output(spec) is not None, spec.name
        assert spec.guarantees, f"{spec.name} names no guarantee"


@pytest.fixture
def runner(migrated_db):
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        Keel(conn).define_workflow("akc-specs", 1, "queued", EDGES)
    return Runner(migrated_db, "akc-specs")


def spec_named(name: str):
    return next(s for s in load_specs() if s.name == name)


def test_the_shipped_specs_pass(runner):
    for spec in load_specs():
        assert runner.run(spec) == expected_output(spec), spec.name


def test_a_high_water_mark_reader_is_caught_skipping_a_message(runner):
    spec = spec_named("outbox_commit_order")
    # Reads what is above the highest id seen so far, then raises the mark.
    hwm = (
        "create temp table if not exists seen (m uuid);"
        " with fresh as ("
        "   select message_id, topic from keel.outbox where tenant_id = {tenant}"
        "   and message_id > coalesce("
        "     (select max(m) from seen), '00000000-0000-0000-0000-000000000000'::uuid)"
        " ), mark as (insert into seen select max(message_id) from fresh)"
        " select topic from fresh order by message_id"
    )
    broken = dataclasses.replace(
        spec,
        sessions={
            **spec.sessions,
            "reader": [Step("r_pending", "reader", hwm)],
        },
    )
    transcript = runner.run(broken)
    assert transcript != expected_output(spec)
    last_read = re.findall(r"step r_pending: (.*)", transcript)[-1]
    assert "first" not in last_read, transcript  # the message that committed late is skipped


def test_a_reserve_without_the_hash_comparison_is_caught(runner, migrated_db):
    mutation = BY_NAME["hash_unchecked"]
    broken = mutation.apply((REPO / mutation.path).read_text())
    with psycopg.connect(migrated_db, autocommit=True) as conn:
        conn.execute(broken.encode())
    spec = spec_named("reserve_different_input")
    transcript = runner.run(spec)
    assert transcript != expected_output(spec)
    assert "idempotency_conflict" not in transcript
