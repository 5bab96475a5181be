"""One error registry: keel.error_codes(), agentkeel.errors and the codes functions raise agree."""

from __future__ import annotations

import re

import psycopg

from agentkeel.distribute import CITUS_VARIANTS
from agentkeel.errors import ERRORS, KeelError, LeaseLost, translate
from conftest import REPO

RAISED = re.compile(r"errcode\s*=\s*'([0-9A-Z]{5})'", re.IGNORECASE)
STANDARD_CODES_WE_RAISE = {
    "40001",  # serialization_failure: retry, not an agentkeel error
    "42501",  # insufficient_privilege: keel.watchdog's caller lacks a predefined role
}


def raised_codes() -> set[str]:
    codes: set[str] = set()
    # functions/ and the Citus variants `agentkeel distribute` installs in their place
    for path in [*(REPO / "functions").glob("*.sql"), *CITUS_VARIANTS]:
        codes |= set(RAISED.findall(path.read_text()))
    return codes


def test_python_and_sql_registries_are_identical(migrated_db):
    with psycopg.connect(migrated_db) as conn:
        rows = conn.execute("select sqlstate, name from keel.error_codes()").fetchall()
    assert dict(rows) == {code: cls.name for code, cls in ERRORS.items()}


def test_every_raised_code_is_registered_and_every_registered_code_is_raised():
    custom = raised_codes() - STANDARD_CODES_WE_RAISE
    assert custom == set(ERRORS)


def test_codes_sit_in_a_standard_class_with_an_implementation_defined_subclass():
    for code in ERRORS:
        assert code[:2] in {"22", "23", "42", "54", "55"}, code
        assert code[2] in "IJKLMNOPQRSTUVWXYZ", code


def test_a_database_error_is_translated_with_detail_and_hint(migrated_db):
    with psycopg.connect(migrated_db) as conn:
        try:
            conn.execute(
                "do $$ begin raise exception using errcode = '55K03', message = 'm',"
                " detail = 'd', hint = 'h'; end $$"
            )
        except psycopg.Error as err:
            translated = translate(err)
    assert isinstance(translated, LeaseLost) and isinstance(translated, KeelError)
    assert (translated.message, translated.detail, translated.hint) == ("m", "d", "h")
    assert "55K03 lease_lost" in str(translated)
