"""errcodes: every RAISE EXCEPTION carries a documented SQLSTATE."""

from __future__ import annotations

import re
from collections.abc import Iterator

from agentkeel.lint.core import Finding, SqlFile

IMPLEMENTATION_DEFINED = "IJKLMNOPQRSTUVWXYZ"  # a subclass letter a standard never uses


def registry_codes(files: list[SqlFile]) -> set[str]:
    for f in files:
        if f.name.endswith("error_codes.sql"):
            return set(re.findall(r"\('([0-9A-Z]{5})',", f.text))
    return set()


RAISE = re.compile(r"\braise\s+exception\b(.*?);", re.IGNORECASE | re.DOTALL)
ERRCODE = re.compile(r"errcode\s*=\s*'([0-9A-Za-z]{5})'", re.IGNORECASE)


def check_errcodes(files: list[SqlFile]) -> Iterator[Finding]:
    codes = registry_codes(files)
    for f in files:
        for match in RAISE.finditer(f.text):
            found = ERRCODE.search(match.group(1))
            line = f.line_of(match.start())
            if found is None:
                yield Finding(
                    f.name,
                    line,
                    "errcodes",
                    "RAISE EXCEPTION without an ERRCODE "
                    "(callers could only match the message text)",
                )
            elif found.group(1).upper() == "P0001":
                yield Finding(f.name, line, "errcodes", "P0001 is the generic raise_exception code")
            elif found.group(1)[2] in IMPLEMENTATION_DEFINED and found.group(1) not in codes:
                yield Finding(
                    f.name,
                    line,
                    "errcodes",
                    f"ERRCODE {found.group(1)} is not in keel.error_codes()",
                )
