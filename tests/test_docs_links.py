"""README.md, notebooks/README.md and docs/**/*.md: every relative link (and #anchor)
resolves, and every file path they name in backticks (`workbench/...`, `tests/...`, ...)
exists, so moved code cannot leave stale pointers behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "notebooks" / "README.md",
         *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"`((?:workbench|tests|kernels|experiments|scripts|notebooks|docs)/[^`\s]*)`")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.*)$", page.read_text(), re.M)}


def problems(page: Path) -> list[str]:
    text = page.read_text()
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, frag = target.partition("#")
        full = (page.parent / path).resolve() if path else page
        if not full.exists():
            out.append(f"link {target} does not exist")
        elif frag and full.suffix == ".md" and frag not in _anchors(full):
            out.append(f"link {target}: no heading #{frag}")
    for m in PATH.finditer(text):
        if "<" in m.group(1):  # a placeholder: `workbench/models/<arch>.py`
            continue
        path = re.sub(r"\{[^}]*\}", "", m.group(1).split("::")[0].rstrip("/"))
        if not list(ROOT.glob(path)) and not list(ROOT.glob(path + "*")):
            out.append(f"path {m.group(1)} does not exist")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_paths_resolve(page: Path) -> None:
    assert problems(page) == []


def test_a_planted_stale_link_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n[ok](#title) [gone](nowhere.md) [bad](#nope)\n"
                    "`workbench/no_such.py` `tests/test_docs_links.py::test_x`\n")
    assert problems(page) == ["link nowhere.md does not exist", "link #nope: no heading #nope",
                              "path workbench/no_such.py does not exist"]


def test_the_readme_stays_short() -> None:
    assert (ROOT / "README.md").stat().st_size <= 8 * 1024
