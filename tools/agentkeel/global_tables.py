"""keel.global_tables() read from its file, for code that needs it without a database.

functions/global_tables.sql is the one declaration of the keel tables that are not tenant
tables, with their Citus placement. `agentkeel distribute` and its lint rules need the
'local' ones before any database is reached: read here with the PostgreSQL parser.
"""

from __future__ import annotations

from pathlib import Path

from pglast import ast, parse_sql

from agentkeel.sql_files import sql_root

FILE = "functions/global_tables.sql"


def declared_placements(root: Path | None = None) -> dict[str, str]:
    """{qualified table name: placement} as functions/global_tables.sql declares them."""
    text = ((root or sql_root()) / FILE).read_text(encoding="utf-8")
    function = parse_sql(text)[0].stmt
    assert isinstance(function, ast.CreateFunctionStmt), FILE
    body = next(o.arg[0].sval for o in function.options or () if o.defname == "as")
    values = parse_sql(body)[0].stmt
    assert isinstance(values, ast.SelectStmt) and values.valuesLists, FILE
    return {row[0].val.sval: row[1].val.sval for row in values.valuesLists}


def local_tables(root: Path | None = None) -> tuple[str, ...]:
    """The plain per-node tables (placement 'local'), never distributed."""
    return tuple(sorted(t for t, p in declared_placements(root).items() if p == "local"))
