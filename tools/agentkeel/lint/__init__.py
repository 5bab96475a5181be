"""`agentkeel lint`: static checks of the SQL files, before they reach a database.

Three sources of findings, all reported as `file:line: rule: message`:
- sqlfluff (style and parse errors) and squawk (migration safety, schema/ only), run with
  the project's .sqlfluff and .squawk.toml (`tools`);
- invariants read from the statements with pglast: tenant keys (`tenancy`), row-level
  security (`rls`), SECURITY DEFINER hygiene (`security_definer`), documented error codes
  (`errcodes`), released migrations left unedited (`released`, asking `git`);
- the `citus` family: the rules of CITUS.md §(c) that can be decided from the files
  (`citus`; rules 28-31, found on a real cluster, in `citus_cluster`).

`core` holds the Finding type, the loaded files and tables, and the output formats.
"""

from __future__ import annotations

from pathlib import Path

from agentkeel.lint.citus import check_citus
from agentkeel.lint.citus_cluster import check_cluster
from agentkeel.lint.core import Finding, load, render, tables, to_json
from agentkeel.lint.errcodes import check_errcodes
from agentkeel.lint.released import check_released
from agentkeel.lint.rls import check_rls
from agentkeel.lint.security_definer import check_security_definer
from agentkeel.lint.tenancy import check_tenancy, check_tenant_keys, global_tables
from agentkeel.lint.tools import (
    LintToolError,
    ToolCrashed,
    ToolMissing,
    run_sqlfluff,
    run_squawk,
)

__all__ = [
    "Finding",
    "LintToolError",
    "ToolCrashed",
    "ToolMissing",
    "lint",
    "render",
    "to_json",
]


def lint(paths: list[Path], root: Path, *, citus: bool = True, tools: bool = True) -> list[Finding]:
    """Every finding, sorted. Raises ToolMissing or ToolCrashed (both LintToolError) when
    sqlfluff or squawk cannot answer, unless tools=False."""
    files, findings = load(paths, root)
    known = tables(files)
    findings += check_tenancy(files, known, global_tables(files, root))
    findings += check_tenant_keys(files, known)
    findings += check_rls(files, known)
    findings += check_security_definer(files)
    findings += check_errcodes(files)
    findings += check_released(root)
    if citus:
        findings += check_citus(files, known)
        findings += check_cluster(files, known)
    if tools:
        findings += run_sqlfluff(paths, root)
        findings += run_squawk(files, root)
    # `-- agentkeel:allow <rule> (why)` waives that rule in its own file, for every family.
    waived = {f.name: f.allowed for f in files}
    return sorted({x for x in findings if x.rule not in waived.get(x.file, set())})
