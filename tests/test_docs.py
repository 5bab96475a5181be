"""The README and docs/ stay true to the code and to each other: the generated tables
(SQLSTATEs, exit codes) are what the code says, every link resolves inside the
repository, the README stays short and leads to every docs page."""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest

from agentkeel.errors import ERRORS
from agentkeel.exitcodes import markdown_table
from agentkeel_conformance.guarantees import GUARANTEES
from conftest import REPO, run_agentkeel

README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 230

# External pages the docs may link to: https only, each listed here on purpose. None yet.
ALLOWED_EXTERNAL: frozenset[str] = frozenset()


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def page_id(path: Path) -> str:
    return str(path.relative_to(REPO))


# --- reading markdown -------------------------------------------------------------------

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(
    r"!?\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]"
    r"\(\s*<?(?P<target>[^)\s>]*)>?(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(?P<target>\S+?)>?(?:\s.*)?$")
AUTOLINK = re.compile(r"<(?P<target>[a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]*)>")
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["'](?P<target>[^"']*)["']""", re.IGNORECASE)
BARE_URL = re.compile(r"\bhttps?://[^\s)>\]]+")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
            continue
        if fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
                fence = None
            continue
        lines.append((number, line))
    return lines


def headings(text: str) -> list[str]:
    return [m.group(2) for _, line in prose_lines(text) if (m := HEADING.match(line))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text, lower case, punctuation other than
    '-' and '_' dropped, each space a '-'."""
    text = LINK.sub(lambda m: m.group("text"), heading)
    text = INLINE_CODE.sub(lambda m: m.group(2), text)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(path.read_text()):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link, image, reference definition, autolink, HTML link and
    bare URL outside code, a link's text may run over several lines."""
    kept = dict(prose_lines(path.read_text()))
    lines = [kept.get(n, "") for n in range(1, max(kept, default=0) + 1)]
    found = []
    for number, line in enumerate(lines, 1):
        if m := REFERENCE_DEFINITION.match(line):
            found.append((number, m.group("target")))
            lines[number - 1] = ""
    text = INLINE_CODE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), "\n".join(lines))
    for pattern in (LINK, AUTOLINK, HTML_LINK, BARE_URL):
        for m in pattern.finditer(text):
            target = m.group("target") if "target" in pattern.groupindex else m.group(0)
            found.append((text.count("\n", 0, m.start()) + 1, target))
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    return sorted(found)


def link_problem(page: Path, target: str) -> str | None:
    """Why a link of this page does not resolve inside the repository, or None."""
    if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
        if target.startswith("https://") and target in ALLOWED_EXTERNAL:
            return None
        return "an external link (only the https pages in ALLOWED_EXTERNAL may be linked)"
    if not target:
        return "an empty link"
    file_part, _, anchor = target.partition("#")
    if file_part.startswith("/"):
        return "an absolute path: link relative to the page"
    resolved = (page.parent / file_part).resolve() if file_part else page
    if not resolved.is_relative_to(REPO):
        return "outside the repository"
    if not resolved.is_file():
        return "no such file in the repository"
    if anchor:
        if resolved.suffix != ".md":
            return "an anchor into a file that is not markdown"
        if anchor not in anchors(resolved):
            return f"no heading with the anchor #{anchor} in {page_id(resolved)}"
    return None


def markdown_tables(text: str) -> list[list[str]]:
    """Each run of consecutive table lines outside code."""
    tables: list[list[str]] = []
    previous = None
    for number, line in prose_lines(text):
        if line.startswith("|"):
            if previous == number - 1:
                tables[-1].append(line)
            else:
                tables.append([line])
            previous = number
    return tables


# --- the README and the docs pages --------------------------------------------------------


def test_slugs_follow_githubs_rules():
    assert slug("Behind a connection pooler") == "behind-a-connection-pooler"
    assert slug("`agentkeel check`") == "agentkeel-check"
    assert slug("Outbox delivery (G6)") == "outbox-delivery-g6"
    assert slug("Bootstrap: the DBA's first step") == "bootstrap-the-dbas-first-step"
    assert slug("What the database enforces, and the limits") == (
        "what-the-database-enforces-and-the-limits"
    )
    assert slug("Run ledger [G8](x.md) — the_steps") == "run-ledger-g8--the_steps"
    assert [slug(h) for h in headings("## C# in a heading ##\n")] == ["c-in-a-heading"]


def test_the_link_checker_refuses_what_it_must(tmp_path):
    page = DOCS / "errors.md"
    assert link_problem(page, "https://example.com/") is not None
    assert link_problem(page, "http://localhost/x") is not None
    assert link_problem(page, "mailto:someone@example.com") is not None
    assert link_problem(page, "../../outside.md") == "outside the repository"
    assert link_problem(page, "/etc/passwd") is not None
    assert link_problem(page, "nowhere.md") == "no such file in the repository"
    assert link_problem(page, "../README.md#no-such-heading") is not None
    assert link_problem(page, "#exit-codes") is None
    assert link_problem(page, "../README.md") is None
    sample = tmp_path / "p.md"
    sample.write_text(
        "# A\n## A\n```sh\n# not a heading [x](nowhere.md)\n```\n"
        "[a](x.md) ![b](y.png 'title') `[c](z.md)` <https://e.example> see https://f.example\n"
        '[ref]: ../r.md\n<img src="i.png">\n[a link over\ntwo lines](m.md)\n'
    )
    assert anchors(sample) == {"a", "a-1"}
    assert sorted(t for _, t in links(sample)) == sorted(
        ["../r.md", "x.md", "y.png", "https://e.example", "i.png", "https://f.example", "m.md"]
    )
    assert (9, "m.md") in links(sample)


def test_every_link_resolves_inside_the_repository():
    problems = [
        f"{page_id(page)}:{number}: ({target}) {problem}"
        for page in pages()
        for number, target in links(page)
        if (problem := link_problem(page, target))
    ]
    assert not problems, "\n".join(problems)


def test_the_readme_is_short():
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_every_docs_page_is_linked_from_the_readme():
    linked = set()
    for _, target in links(README):
        file_part = target.partition("#")[0]
        if file_part and not link_problem(README, file_part):
            linked.add((README.parent / file_part).resolve())
    missing = [page_id(p) for p in sorted(DOCS.rglob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_guarantee_table_is_one_table_with_every_guarantee():
    """One unbroken table in the README, a row per guarantee in the suite's order."""
    (table,) = [
        t for t in markdown_tables(README.read_text()) if t[0] == "| guarantee | proven by |"
    ]
    ids = [row.split("|")[1].split()[0] for row in table[2:]]
    assert ids == list(GUARANTEES), ids


# --- generated tables -----------------------------------------------------------------------


def table_after(text: str, header: str) -> str:
    """The table whose first line is `header`, up to its last line."""
    (table,) = [t for t in markdown_tables(text) if t[0] == header]
    return "\n".join(table) + "\n"


def sqlstate_table(rows: list[tuple[str, str, str]]) -> str:
    lines = ["| SQLSTATE | name | Python | meaning |", "|---|---|---|---|"]
    for sqlstate, name, description in rows:
        meaning = description.replace("|", "\\|")
        python = ERRORS[sqlstate].__name__ if sqlstate in ERRORS else "(no class)"
        lines.append(f"| {sqlstate} | {name} | `{python}` | {meaning} |")
    return "\n".join(lines) + "\n"


def test_the_sqlstate_table_is_keel_error_codes(migrated_db):
    with psycopg.connect(migrated_db) as conn:
        rows = conn.execute(
            "select sqlstate, name, description from keel.error_codes() order by sqlstate"
        ).fetchall()
    expected = sqlstate_table(rows)
    documented = table_after(
        (DOCS / "errors.md").read_text(), "| SQLSTATE | name | Python | meaning |"
    )
    assert documented == expected, f"docs/errors.md's SQLSTATE table should read:\n{expected}"


def test_the_exit_code_table_is_the_enum():
    text = (DOCS / "errors.md").read_text()
    section = text.split("## Exit codes\n", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|")) + "\n"
    assert table == markdown_table(), (
        f"docs/errors.md's exit codes should read:\n{markdown_table()}"
    )
    assert run_agentkeel("exit-codes", "--markdown").stdout == markdown_table()


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_every_page_opens_with_a_title_and_a_summary(page):
    lines = page.read_text().splitlines()
    assert lines[0].startswith("# "), "the first line is the page's title"
    first = next(line for line in lines[1:] if line.strip())
    assert not first.startswith(("#", "|", "```", "-", "*")), "a summary paragraph comes first"
