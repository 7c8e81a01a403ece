"""Every citation in the code resolves inside the repository's ``docs/``.

A citation is ``docs/<file>.md §N.M`` (also ``§A-§B`` ranges and lists such as ``§3.5 and §3.9``,
which take the document named before them on the line or earlier in the paragraph), or a bare
invariant name ``I1``…``I7`` (defined in ``docs/reliability.md §0``). Inside ``docs/`` a bare
``§N`` means the containing file. The docs' own references to tests (``tests/x.py::test_y``) and to
modules (``plugin/allocator.py``, ``scheduler/refit/plan.py``) must exist too, so the docs move with the code,
and every relative Markdown link of the README and ``docs/`` names a file (and heading) that exists.

A citation by one of the research notes' names the code was first written from (:data:`LEGACY`),
or a bare ``§`` in code that names no document on its line or paragraph, is an error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SCANNED = ("hamid", "sim", "tests", "bench")
SELF = Path(__file__).resolve()

#: The research notes' names the code once cited, and the docs file that replaced each.
LEGACY = {
    "hami-wire": "hami-wire.md",
    "kubelet-and-extender": "kubelet-and-extender.md",
    "numa-refit-upstream": "refit.md",
    "upstream-pain": "reliability.md",
}
INVARIANTS_DOC = "reliability.md"

_LEGACY_NAMES = "|".join(sorted(map(re.escape, LEGACY), key=len, reverse=True))
DOC_RE = re.compile(rf"docs/(?P<doc>[\w.-]+?\.md)|(?:reference/)?\b(?P<legacy>{_LEGACY_NAMES})\b(?:\.md)?")
SECTION_RE = re.compile(r"§(?P<first>\d+(?:\.\d+)*)(?:\s*[-\u2013]\s*§?(?P<last>\d+(?:\.\d+)*))?")
HEADING_RE = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.MULTILINE)
INVARIANT_RE = re.compile(r"\bI([1-7])\b")
INVARIANT_DEF_RE = re.compile(r"^\*\*I([1-9])\b", re.MULTILINE)
TEST_REF_RE = re.compile(r"\b(tests/[\w/]+\.py)(?:::(\w+))?")
LINK_RE = re.compile(r"\]\((?!https?:|mailto:)(?P<path>[^)#\s]*)(?:#(?P<anchor>[^)\s]+))?\)")
MODULE_REF_RE = re.compile(
    r"`(?:hamid/)?((?:model|fit|kube|scheduler|plugin)/(?:\w+/)*\w+\.py)|`(?:sim/)?(hamidsim/(?:\w+/)*\w+\.py)"
)


@dataclass(frozen=True, slots=True)
class Mention:
    """A document named at a position of a file (``legacy``: by a research note's name)."""

    line: int
    column: int
    doc: str
    legacy: bool


@dataclass(frozen=True, slots=True)
class Citation:
    """One ``§`` reference and the document it resolved to (``None``: unresolvable)."""

    where: str
    doc: str | None
    sections: tuple[str, ...]
    problem: str = ""


def doc_sections(name: str) -> set[str]:
    """Section numbers of ``docs/<name>`` from its headings (``## 3.`` and ``### 3.5``)."""
    path = DOCS / name
    return set(HEADING_RE.findall(path.read_text())) if path.is_file() else set()


def _mentions(lines: list[str]) -> list[Mention]:
    out = []
    for number, line in enumerate(lines):
        for match in DOC_RE.finditer(line):
            if match["doc"]:
                out.append(Mention(number, match.start(), match["doc"], legacy=False))
            else:
                out.append(Mention(number, match.start(), LEGACY[match["legacy"]], legacy=True))
    return out


def _paragraph_start(lines: list[str], number: int) -> int:
    while number > 0 and lines[number - 1].strip() not in ("", "#", '"""'):
        number -= 1
    return number


def _resolve(
    lines: list[str], mentions: list[Mention], number: int, column: int, home: str | None
) -> tuple[Mention | None, str]:
    """The mention a ``§`` at (number, column) refers to, and a problem text ("" when fine)."""
    start = _paragraph_start(lines, number)
    before = [m for m in mentions if start <= m.line < number or (m.line == number and m.column < column)]
    if before:
        return before[-1], ""
    if home is not None:
        return Mention(number, column, home, legacy=False), ""
    return None, "names no document on its line or in its paragraph"


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def citations(path: Path, home: str | None = None) -> list[Citation]:
    """Every ``§`` citation of ``path``; ``home`` is the file a bare ``§`` means (docs only)."""
    lines = path.read_text(errors="replace").splitlines()
    mentions = _mentions(lines)
    out = []
    for number, line in enumerate(lines):
        for match in SECTION_RE.finditer(line):
            where = f"{_shown(path)}:{number + 1}: {line.strip()}"
            sections = tuple(s for s in (match["first"], match["last"]) if s)
            mention, problem = _resolve(lines, mentions, number, match.start(), home)
            if mention is not None and mention.legacy:
                problem = "uses a research note's name; cite docs/<file>.md"
            out.append(Citation(where, mention.doc if mention else None, sections, problem))
    return out


def code_files() -> list[Path]:
    """The Python files whose citations must resolve (this test excluded)."""
    files = [p for top in SCANNED for p in sorted((ROOT / top).rglob("*.py"))]
    return [p for p in files if p.resolve() != SELF and "_proto" not in p.parts]


def _broken(found: list[Citation]) -> list[str]:
    problems = []
    for citation in found:
        if citation.problem or citation.doc is None:
            problems.append(f"{citation.where}  -- {citation.problem}")
            continue
        if not (DOCS / citation.doc).is_file():
            problems.append(f"{citation.where}  -- docs/{citation.doc} does not exist")
            continue
        missing = [s for s in citation.sections if s not in doc_sections(citation.doc)]
        if missing:
            problems.append(f"{citation.where}  -- docs/{citation.doc} has no section {', '.join(missing)}")
    return problems


def test_code_citations_name_existing_sections() -> None:
    found = [c for path in code_files() for c in citations(path)]
    assert found, "no § citation found at all: the scan is broken"
    assert _broken(found) == []


def test_docs_cross_references_name_existing_sections() -> None:
    found = [c for path in sorted(DOCS.glob("*.md")) for c in citations(path, home=path.name)]
    assert found
    assert _broken(found) == []


def test_cited_invariants_are_defined() -> None:
    defined = set(INVARIANT_DEF_RE.findall((DOCS / INVARIANTS_DOC).read_text()))
    assert defined == {str(i) for i in range(1, 8)}
    cited = {n for path in code_files() for n in INVARIANT_RE.findall(path.read_text(errors="replace"))}
    assert cited and cited <= defined


def test_docs_reference_existing_tests_and_modules() -> None:
    problems = []
    for doc in sorted(DOCS.glob("*.md")):
        text = doc.read_text()
        for match in TEST_REF_RE.finditer(text):
            path = ROOT / match[1]
            if not path.is_file():
                problems.append(f"{doc.name}: {match[0]} -- no such file")
            elif match[2] and not re.search(rf"^\s*(?:async\s+)?def {match[2]}\(", path.read_text(), re.M):
                problems.append(f"{doc.name}: {match[0]} -- no such test")
        for match in MODULE_REF_RE.finditer(text):
            path = ROOT / "hamid" / match[1] if match[1] else ROOT / "sim" / match[2]
            if not path.is_file():
                problems.append(f"{doc.name}: {match[1] or match[2]} -- no such module")
    assert problems == []


def test_the_resolver_reads_lists_ranges_and_legacy_names(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""See docs/refit.md §2-§4 and hami-wire §3.5, §3.9.\n\nBare §4.7 here."""\n'
        "# docs/kubelet-and-extender.md §9.9\n"
    )
    found = citations(sample)
    resolved = [(c.doc, c.sections) for c in found]
    assert resolved[:3] == [
        ("refit.md", ("2", "4")),
        ("hami-wire.md", ("3.5",)),
        ("hami-wire.md", ("3.9",)),
    ]
    assert resolved[3][1] == ("4.7",)
    assert _broken(found[4:]) != []  # §9.9 does not exist


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file (fenced code skipped)."""
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (heading := re.match(r"^#{1,6}\s+(.*)", line)):
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def broken_links(page: Path) -> list[str]:
    """Relative links of ``page`` whose file, or heading anchor in a Markdown file, is missing."""
    problems = []
    for match in LINK_RE.finditer(page.read_text()):
        target = (page.parent / match["path"]).resolve() if match["path"] else page
        if not target.exists():
            problems.append(f"{_shown(page)}: {match[0]} -- no such file")
        elif match["anchor"] and target.suffix == ".md" and match["anchor"] not in anchors(target):
            problems.append(f"{_shown(page)}: {match[0]} -- no such heading")
    return problems


def test_readme_and_docs_links_resolve() -> None:
    pages = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    assert [problem for page in pages for problem in broken_links(page)] == []


def test_the_link_check_sees_missing_files_and_headings(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("## A `b` c, d\n[ok](#a-b-c-d) [gone](#nope) [file](missing.md) [web](https://x.y/#z)\n")
    assert [p.split(" -- ")[1] for p in broken_links(page)] == ["no such heading", "no such file"]
