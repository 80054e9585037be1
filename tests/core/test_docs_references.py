"""The repository's references resolve inside the repository.

Code comments and docstrings cite the reference in ``docs/`` by path and section
(``docs/api/common.md#prompt-limits``): every such reference must name a file that exists and
a heading in it (GitHub's anchors: lowercase, spaces to hyphens, punctuation dropped), and no
citation of the external digest the docs replaced may remain. The links between the docs
pages (and the README's) must resolve too, without leaving the repository.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("python", "rust", "tests", "benches")
CODE_SUFFIXES = (".py", ".pyi", ".rs")
SKIPPED = ("tests/data/",)

#: A citation of the external digest: its section numbers and its numbered ambiguities.
_DIGEST = "SP" + "EC"  # spelled apart so that this file does not cite it
CITATION = re.compile(rf"\b{_DIGEST}\b|(?<![\w-])A-\d+\b")
#: A reference to the docs, as code writes it.
DOC_REF = re.compile(r"(?<![\w./-])docs/[\w./-]+?\.md(?:#[\w-]+)?")
#: A Markdown link's target.
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
#: Pages the docs site generates when it is built (docs/hooks/): links to them resolve on the
#: site only, where `mkdocs build --strict` checks them and their anchors
#: (tests/core/test_docs_site.py).
GENERATED = frozenset({ROOT / "docs" / "reference" / "configuration.md"})

#: The code citations are rewritten by a script run once the branches touching the code have
#: merged; until then they still cite the digest.


def code_files() -> Iterator[Path]:
    for directory in CODE_DIRS:
        for path in sorted((ROOT / directory).rglob("*")):
            rel = path.relative_to(ROOT).as_posix()
            if path.suffix in CODE_SUFFIXES and path.is_file() and not rel.startswith(SKIPPED):
                yield path


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def github_anchor(title: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (a repeated heading gets -1, -2, ...)."""
    found: set[str] = set()
    seen: Counter[str] = Counter()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        heading = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is None:
            continue
        anchor = github_anchor(heading[1])
        found.add(f"{anchor}-{seen[anchor]}" if seen[anchor] else anchor)
        seen[anchor] += 1
    return found


def unresolved(target: Path, anchor: str) -> str | None:
    """Why a reference to ``target`` (and ``anchor``, when not empty) does not resolve."""
    if ROOT not in target.resolve().parents:
        return "points outside the repository"
    if target.resolve() in GENERATED:
        return None
    if not target.is_file():
        return "no such file"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"no heading with anchor #{anchor}"
    return None


def test_no_citation_of_the_digest_remains() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in code_files()
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if CITATION.search(line)
    ]
    assert not found, "\n".join(found)


def test_docs_references_in_code_resolve() -> None:
    bad = []
    num_refs = 0
    for path in code_files():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for ref in DOC_REF.findall(line):
                num_refs += 1
                file, _, anchor = ref.partition("#")
                why = unresolved(ROOT / file, anchor)
                if why is not None:
                    bad.append(f"{path.relative_to(ROOT)}:{n}: {ref}: {why}")
    assert num_refs > 0, "no code cites docs/"
    assert not bad, "\n".join(bad)


def test_docs_links_resolve_inside_the_repository() -> None:
    bad = []
    for path in markdown_files():
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for target in MD_LINK.findall(text):
            if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            why = unresolved(path.parent / file if file else path, anchor)
            if why is not None:
                bad.append(f"{path.relative_to(ROOT)}: {target}: {why}")
    assert not bad, "\n".join(bad)


def test_github_anchors() -> None:
    assert github_anchor("n, best of and beam search") == "n-best-of-and-beam-search"
    assert github_anchor("The `InferenceRequest`") == "the-inferencerequest"
    assert github_anchor("Ids, timestamps and model names") == "ids-timestamps-and-model-names"
