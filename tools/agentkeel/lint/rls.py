"""rls: every tenant table has row-level security enabled, forced and a policy."""

from __future__ import annotations

from collections.abc import Iterator

from pglast.enums import AlterTableType, ObjectType

from agentkeel.lint.core import Finding, SqlFile, Table, kind, names, qualified


def check_rls(files: list[SqlFile], known: dict[str, Table]) -> Iterator[Finding]:
    """Every tenant table has RLS enabled, forced and a policy: explicitly, or through the
    catalog loop in policies/ over keel.tenant_tables(), every table with a tenant_id column."""
    loop = {"enable": False, "force": False, "policy": False}
    explicit: dict[str, set[str]] = {}
    for f in files:
        for stmt, line in f.statements:
            stmt_kind = kind(stmt)
            if stmt_kind == "DoStmt" and f.name.startswith("policies/"):
                body = " ".join(
                    str(a.arg.sval) for a in stmt.args or () if a.defname == "as"
                ).lower()
                if "keel.tenant_tables()" in body:
                    loop["enable"] |= "enable row level security" in body
                    loop["force"] |= "force row level security" in body
                    loop["policy"] |= "create policy" in body
            elif stmt_kind == "AlterTableStmt":
                target = qualified(stmt.relation)
                for cmd in stmt.cmds or ():
                    if cmd.subtype == AlterTableType.AT_EnableRowSecurity:
                        explicit.setdefault(target, set()).add("enable")
                    elif cmd.subtype == AlterTableType.AT_ForceRowSecurity:
                        explicit.setdefault(target, set()).add("force")
                    elif cmd.subtype == AlterTableType.AT_NoForceRowSecurity:
                        yield Finding(
                            f.name,
                            line,
                            "rls",
                            f"{target}: NO FORCE ROW LEVEL SECURITY "
                            "lets the table owner bypass tenant isolation",
                        )
                    elif cmd.subtype == AlterTableType.AT_DisableRowSecurity:
                        yield Finding(
                            f.name,
                            line,
                            "rls",
                            f"{target}: DISABLE ROW LEVEL SECURITY removes tenant isolation",
                        )
            elif stmt_kind == "CreatePolicyStmt":
                explicit.setdefault(qualified(stmt.table), set()).add("policy")
            elif stmt_kind == "DropStmt" and stmt.removeType == ObjectType.OBJECT_POLICY:
                for obj in stmt.objects or ():
                    parts = names(obj)
                    on_table = ".".join(parts[:-1])
                    recreated = any(
                        kind(s) == "CreatePolicyStmt"
                        and qualified(s.table) == on_table
                        and s.policy_name == parts[-1]
                        for s, _ in f.statements
                    )
                    if not recreated:
                        yield Finding(
                            f.name,
                            line,
                            "rls",
                            f"{on_table}: policy {parts[-1]} is dropped and not created again",
                        )
    for table in known.values():
        if not table.tenant:
            continue
        for need in ("enable", "force", "policy"):
            if not loop[need] and need not in explicit.get(table.name, set()):
                what = {"enable": "enabled", "force": "forced", "policy": "given a tenant policy"}[
                    need
                ]
                yield Finding(
                    table.file.name,
                    table.line,
                    "rls",
                    f"{table.name} has tenant_id but row-level security is never {what}",
                )
