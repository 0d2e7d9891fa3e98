"""scripts/docs_pages.py: the documentation site's pages cut from README.md lose no section, and a README
heading that no page takes (or a page rule that takes none) stops the build with its name."""

from __future__ import annotations

import importlib.util
import re
import sys
import unicodedata
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("docs_pages", ROOT / "scripts" / "docs_pages.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["docs_pages"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_every_readme_section_is_on_a_page(tmp_path: Path) -> None:
    pages = load()
    assert pages.main(tmp_path) == 0
    text = {p.name: p.read_text() for p in (tmp_path / "docs").glob("*.md")}
    site = "\n".join(text.values())
    readme = (ROOT / "README.md").read_text()
    for level, title, lines in pages.sections(readme):
        if level:
            assert re.search(rf"^#+ {re.escape(title)}$", site, re.M), f"section '{title}' is on no page"
        body = [line for line in lines if line.strip()]
        if body:
            assert body[-1] in site, f"the end of section '{title}' is on no page"
    assert text["install.md"].startswith("# Install\n")
    assert "::: prestage.Loader" in text["api.md"]
    config = (tmp_path / "mkdocs.yml").read_text()
    assert "@NAV@" not in config and "- Install: install.md" in config


def test_a_readme_heading_on_no_page_stops_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pages = load()
    monkeypatch.setattr(pages, "PAGES", [p for p in pages.PAGES if p[0] != "cli.md"])
    with pytest.raises(SystemExit, match="README section 'Command line' is on no page"):
        pages.main(tmp_path)


def test_a_rule_that_takes_no_section_stops_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pages = load()
    monkeypatch.setattr(pages, "PAGES", pages.PAGES + [("gone.md", "Gone", ("A heading long renamed",))])
    with pytest.raises(SystemExit, match="no README section starts with \\['A heading long renamed'\\]"):
        pages.main(tmp_path)


def slug(title: str) -> str:
    """A heading's anchor as MkDocs's toc extension makes it (and GitHub, for these titles)."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def broken_links(page: Path) -> List[str]:
    """The relative links and images of a Markdown page whose file, or heading, is not there."""
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.is_file():
            broken.append(target)
        elif anchor and anchor not in {slug(h) for h in headings(path)}:
            broken.append(target)
    return broken


def headings(path: Path) -> List[str]:
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):
            out.append(re.sub(r"^#+\s*", "", line))
    return out


def test_the_results_page_and_the_lab_notes_link_to_what_is_there() -> None:
    pages = [ROOT / "benchmarks" / "RESULTS.md", *sorted((ROOT / "benchmarks" / "notes").glob("*.md"))]
    assert len(pages) > 2
    for page in pages:
        assert not broken_links(page), f"{page.relative_to(ROOT)}: links to nothing: {broken_links(page)}"
    assert slug("The paper's experiment: `prestage bench` behind an emulated PFS") == \
        "the-papers-experiment-prestage-bench-behind-an-emulated-pfs"


def test_a_link_to_a_missing_heading_or_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("# Lab notes: A\n\n## The peer tier at scale, simulated: 1 to 1,024 nodes\n")
    page = tmp_path / "RESULTS.md"
    page.write_text("[ok](notes/a.md#the-peer-tier-at-scale-simulated-1-to-1024-nodes) [top](#results)\n"
                    "[gone](notes/a.md#the-peer-tier) [none](notes/b.md) ![plot](plots/x.png)\n\n# Results\n")
    assert broken_links(page) == ["notes/a.md#the-peer-tier", "notes/b.md", "plots/x.png"]


def test_the_site_has_the_results_the_notes_and_their_plots(tmp_path: Path) -> None:
    pages = load()
    assert pages.main(tmp_path) == 0
    docs = tmp_path / "docs"
    notes = sorted(p.name for p in (ROOT / "benchmarks" / "notes").glob("*.md"))
    assert sorted(p.name for p in (docs / "notes").glob("*.md")) == notes
    config = (tmp_path / "mkdocs.yml").read_text()
    assert "- Benchmark results: results.md" in config and "    - The peer tier: notes/peer-tier.md" in config
    for page in [docs / "results.md", *sorted((docs / "notes").glob("*.md"))]:
        assert not broken_links(page), f"site {page.name}: links to nothing: {broken_links(page)}"
