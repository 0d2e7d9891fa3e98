"""scripts/docs_pages.py: the documentation site's pages cut from README.md lose no section, and a README
heading that no page takes (or a page rule that takes none) stops the build with its name."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

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
