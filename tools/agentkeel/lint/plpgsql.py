"""Function bodies as statements: PL/pgSQL parsed with pglast's PL/pgSQL parser.

pglast.parse_plpgsql compiles the whole CREATE FUNCTION, and refuses a type it cannot
look up (anything schema-qualified outside pg_catalog and public, such as `keel.tasks`).
So the function is parsed in a copy where every `keel.`-qualified type of a parameter,
of RETURNS and of a DECLARE section reads `record` (or `text` for `%type`): the body
keeps its lines, so every statement keeps its line number. Each SQL statement and
expression the tree holds (PERFORM, EXECUTE, assignments and conditions included) is
then parsed with pglast.parse_sql. A body the parser still refuses is scanned with the
regular expression that used to serve every body, and lint reports that it did.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pglast import parse_plpgsql, parse_sql
from pglast.enums import FunctionParameterMode
from pglast.parser import ParseError

from agentkeel.lint.core import Finding, SqlFile, kind, names

STATEMENT = re.compile(r"(?is)\b(select|update|delete|insert|perform)\b.*?;")
DECLARE = re.compile(r"(?is)\bdeclare\b(.*?)\bbegin\b")
FUNC_PARAM_OUT = FunctionParameterMode.FUNC_PARAM_OUT
FUNC_PARAM_TABLE = FunctionParameterMode.FUNC_PARAM_TABLE
DECLARED_TYPE = re.compile(
    r"(?im)^(\s*\w+\s+(?:constant\s+)?)keel\s*\.\s*[\w.]+?(%rowtype|%type)?"
    r"(?=\s*(?:;|:=|=|not\b|default\b|collate\b))"
)
QUALIFIED_TYPE = re.compile(r"(?i)keel\s*\.\s*\w+(\s*%\s*rowtype)?")


@dataclass
class BodyStatement:
    plpgsql: str  # the PL/pgSQL statement kind: execsql, perform, dynexecute, assign, ...
    sql: str  # its SQL text; an expression reads `select <expression>`
    line: int  # in the file
    node: Any = None  # the parsed statement, None when pglast refused it


@dataclass
class FunctionBody:
    name: str  # schema-qualified
    language: str
    line: int  # the CREATE FUNCTION statement's
    stmt: Any  # the CreateFunctionStmt
    statements: list[BodyStatement] = field(default_factory=list)
    variables: set[str] = field(default_factory=set)  # parameters and declared names
    fallback: str = ""  # why the PL/pgSQL parser could not be used, if it could not

    @property
    def parameters(self) -> list[tuple[str, str]]:
        """(name, type) of each input parameter, in order."""
        out = []
        for p in self.stmt.parameters or ():
            if p.mode in (
                FunctionParameterMode.FUNC_PARAM_OUT,
                FunctionParameterMode.FUNC_PARAM_TABLE,
            ):
                continue
            type_names = names(p.argType.names) if p.argType is not None else []
            out.append((p.name or "", ".".join(n for n in type_names if n != "pg_catalog")))
        return out

    @property
    def security_definer(self) -> bool:
        option = options(self.stmt).get("security")
        return bool(option is not None and option.boolval)

    @property
    def returns(self) -> str:
        rt = self.stmt.returnType
        if rt is None:
            return ""
        return ("setof " if rt.setof else "") + ".".join(names(rt.names))


def options(stmt: Any) -> dict[str, Any]:
    return {o.defname: o.arg for o in stmt.options or ()}


def functions(f: SqlFile) -> Iterator[FunctionBody]:
    """Each function created in the file, with its body's statements."""
    for index, (stmt, line) in enumerate(f.statements):
        if kind(stmt) != "CreateFunctionStmt":
            continue
        opts = options(stmt)
        language = opts["language"].sval.lower() if "language" in opts else "sql"
        body = FunctionBody(".".join(names(stmt.funcname)), language, line, stmt)
        body.variables = {p.name for p in stmt.parameters or () if p.name}
        start = f.locations[index] if index < len(f.locations) else 0
        end = f.locations[index + 1] if index + 1 < len(f.locations) else len(f.text)
        source = f.text[start:end]
        if "as" in opts:
            text = opts["as"][0].sval
            at = f.text.find(text, start)
            first = f.line_of(at) if at >= 0 else line
            if language == "plpgsql":
                _plpgsql(body, source, start, stmt, text, first)
            else:
                body.statements = list(_sql(text, first, "execsql"))
        elif stmt.sql_body is not None:  # a SQL-standard body: RETURN expr / BEGIN ATOMIC
            nodes = stmt.sql_body if isinstance(stmt.sql_body, tuple) else (stmt.sql_body,)
            for node in _flatten(nodes):
                body.statements.append(BodyStatement("sql_body", source, line, node))
        yield body


def _flatten(nodes: Any) -> Iterator[Any]:
    for node in nodes:
        if isinstance(node, tuple | list):
            yield from _flatten(node)
        elif node is not None:
            yield node


def _sql(text: str, first: int, plpgsql: str) -> Iterator[BodyStatement]:
    try:
        raws = parse_sql(text)
    except ParseError:
        yield BodyStatement(plpgsql, text, first)
        return
    for raw in raws:
        at = raw.stmt_location or 0
        end = at + raw.stmt_len if raw.stmt_len else len(text)
        yield BodyStatement(plpgsql, text[at:end], first + text.count("\n", 0, at), raw.stmt)


def parseable(source: str, start: int, stmt: Any, body: str) -> str:
    """The CREATE FUNCTION text with keel-qualified types replaced, lines kept."""
    edits: list[tuple[int, int, str]] = []
    types = [p.argType for p in stmt.parameters or () if p.argType is not None]
    if stmt.returnType is not None:
        types.append(stmt.returnType)
    for type_name in types:
        if names(type_name.names)[:1] != ["keel"] or type_name.location is None:
            continue
        at = type_name.location - start
        match = QUALIFIED_TYPE.match(source, at)
        if match:
            edits.append((match.start(), match.end(), "record"))
    for match in DECLARE.finditer(source):
        for decl in DECLARED_TYPE.finditer(source, match.start(1), match.end(1)):
            replacement = "text" if (decl.group(2) or "").lower() == "%type" else "record"
            edits.append((decl.end(1), decl.end(), replacement))
    for begin, end, replacement in sorted(edits, reverse=True):
        source = source[:begin] + replacement + source[end:]
    return source


def _plpgsql(body: FunctionBody, source: str, start: int, stmt: Any, text: str, first: int) -> None:
    try:
        tree = parse_plpgsql(parseable(source, start, stmt, text))
    except ParseError as err:
        body.fallback = str(err.args[0] if err.args else err)
        body.statements = [
            BodyStatement("regex", m.group(0), first + text.count("\n", 0, m.start()))
            for m in STATEMENT.finditer(text)
        ]
        return
    function = tree[0]["PLpgSQL_function"]
    for datum in function.get("datums", ()):
        for value in datum.values():
            if isinstance(value, dict) and value.get("refname"):
                body.variables.add(value["refname"])
    for plpgsql, query, mode, lineno in _expressions(function.get("action"), "block", 1):
        line = first + lineno - 1
        if mode == 0:  # a whole SQL statement (execsql, perform, return query, for ... in)
            for found in _sql(query, line, plpgsql):
                body.statements.append(found)
            continue
        sql = "select " + (query.split(":=", 1)[1] if mode >= 3 and ":=" in query else query)
        try:
            node = parse_sql(sql)[0].stmt
        except ParseError:
            node = None
        body.statements.append(BodyStatement(plpgsql, sql, line, node))


def _expressions(node: Any, plpgsql: str, lineno: int) -> Iterator[tuple[str, str, int, int]]:
    """(statement kind, query, parse mode, body line) of every PLpgSQL_expr in the tree."""
    if isinstance(node, list):
        for item in node:
            yield from _expressions(item, plpgsql, lineno)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key == "PLpgSQL_expr" and isinstance(value, dict):
                yield plpgsql, value.get("query", ""), int(value.get("parseMode", 0)), lineno
            elif key.startswith("PLpgSQL_stmt_") and isinstance(value, dict):
                inner = key.removeprefix("PLpgSQL_stmt_")
                yield from _expressions(value, inner, int(value.get("lineno") or lineno))
            else:
                yield from _expressions(value, plpgsql, lineno)


def fallback_findings(f: SqlFile, bodies: list[FunctionBody]) -> Iterator[Finding]:
    for body in bodies:
        if body.fallback:
            yield Finding(
                f.name,
                body.line,
                "parse.plpgsql",
                f"{body.name}: the PL/pgSQL parser refused the body ({body.fallback}); "
                "it was scanned with regular expressions instead",
                "fix the body, or report the construct the parser does not know",
            )
