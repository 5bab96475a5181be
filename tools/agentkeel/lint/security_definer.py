"""security_definer: a SECURITY DEFINER function pins its search_path."""

from __future__ import annotations

from collections.abc import Iterator

from agentkeel.lint.core import Finding, SqlFile, kind, names


def check_security_definer(files: list[SqlFile]) -> Iterator[Finding]:
    for f in files:
        for stmt, line in f.statements:
            if kind(stmt) != "CreateFunctionStmt":
                continue
            options = {o.defname: o.arg for o in stmt.options or ()}
            definer = options.get("security")
            if definer is None or not definer.boolval:
                continue
            pinned = any(
                o.defname == "set" and getattr(o.arg, "name", None) == "search_path"
                for o in stmt.options or ()
            )
            if not pinned:
                name = ".".join(names(stmt.funcname))
                yield Finding(
                    f.name,
                    line,
                    "security_definer",
                    f"{name} is SECURITY DEFINER without SET search_path",
                )
