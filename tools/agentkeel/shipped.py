"""What agentkeel ships, as a fresh install holds it: the manifests of the check rules
`shipped_objects` and `shipped_grants`.

Each of those rule files carries its expected set as a generated values list between
`-- agentkeel:shipped` and `-- agentkeel:end shipped`, so the rule stays one psql-runnable
query and needs nothing in the database that an owner could edit. The list is never
written by hand: `python -m agentkeel.shipped` installs the working tree's SQL into a
throwaway cluster (or the empty database of `--dsn`), reads the rule's own inventory (the
query text before `-- agentkeel:report`) and rewrites the list. tests/test_check.py fails
while a list differs from what a fresh install holds.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import psycopg

from agentkeel.check import CHECKS_DIR

BEGIN = "    -- agentkeel:shipped"
END = "    -- agentkeel:end shipped"
REPORT = "-- agentkeel:report"
# The rules with a manifest, and the live columns their manifest lists.
MANIFESTS: dict[str, tuple[str, ...]] = {
    "shipped_objects": ("kind", "identity"),
    "shipped_grants": ("kind", "identity", "grantee", "privilege"),
}
REGENERATE = "python -m agentkeel.shipped"


def rule_path(rule: str) -> Path:
    return CHECKS_DIR / f"{rule}.sql"


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def inventory(conn: psycopg.Connection, rule: str) -> list[tuple[str, ...]]:
    """What the database holds, by the rule's own inventory query, sorted."""
    text = rule_path(rule).read_text(encoding="utf-8")
    columns = ", ".join(f"l.{c}" for c in MANIFESTS[rule])
    query = text.split(REPORT)[0] + f"select distinct {columns} from live as l order by {columns}"
    return [tuple(str(v) for v in row) for row in conn.execute(query.encode()).fetchall()]


def manifest(rule: str) -> list[tuple[str, ...]]:
    """The expected set written in the rule file."""
    text = rule_path(rule).read_text(encoding="utf-8")
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].partition("\n")[2]
    rows = re.findall(r"^\s*\((.*)\),?$", block, flags=re.MULTILINE)
    return [tuple(v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", r)) for r in rows]


def write_manifest(rule: str, rows: list[tuple[str, ...]]) -> None:
    path = rule_path(rule)
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN, 1)
    first_line, _, _ = rest.partition("\n")
    tail = rest.split(END, 1)[1]
    values = ",\n".join("    (" + ", ".join(_literal(v) for v in row) + ")" for row in rows)
    path.write_text(f"{head}{BEGIN}{first_line}\n{values}\n{END}{tail}", encoding="utf-8")


def regenerate(conn: psycopg.Connection) -> None:
    """Rewrite every manifest from the freshly migrated database of conn."""
    for rule in MANIFESTS:
        write_manifest(rule, inventory(conn, rule))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=REGENERATE, description=__doc__)
    parser.add_argument("--dsn", help="an empty database to install into (default: embedded)")
    args = parser.parse_args(argv)

    from agentkeel.embedded import EmbeddedPostgres
    from agentkeel.migrate import migrate_up
    from agentkeel.sql_files import sql_root

    def install_and_read(dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            migrate_up(conn, sql_root())
            regenerate(conn)

    if args.dsn:
        install_and_read(args.dsn)
    else:
        with EmbeddedPostgres() as pg:
            install_and_read(pg.dsn)
    for rule in MANIFESTS:
        print(f"{rule_path(rule)}: {len(manifest(rule))} rows")


if __name__ == "__main__":
    main()
