"""Writes the documentation site's pages from README.md and benchmarks/ (scripts/docs.sh).

    python scripts/docs_pages.py OUTDIR

The README stays the one text: its sections are cut into pages here, by heading (PAGES below), so that
the site and the README cannot drift apart. A section is a heading of level 2 or 3 and what follows it
up to the next such heading; each goes to the page of the first rule its title starts with (a level-3
section with no rule of its own follows its level-2 section). Every README section must land on a
page, and every rule must match a section: a README heading renamed without this table fails the
build. The page's first section heading becomes its title (level 1), the others move up one level.

Also writes the site's other pages from docs/ (the API reference, whose ``:::`` lines mkdocstrings
fills in from the docstrings), the benchmark results (benchmarks/RESULTS.md as results.md, the lab
notes of benchmarks/notes/ as notes/*.md, titled by their first heading, and the plots they show),
and docs/mkdocs.yml with its navigation. The results and notes keep their relative links: a link or
image that does not resolve on the site fails the strict build.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent

# (file, title in the navigation, README heading prefixes): in navigation order.
PAGES: List[Tuple[str, str, Tuple[str, ...]]] = [
    ("index.md", "Overview", ("",)),  # the text before the first section
    ("install.md", "Install", ("Install",)),
    ("loader.md", "The loader", ("Use", "Self-tuning", "Memory", "The I/O trace")),
    ("formats.md", "Formats", ("Formats", "Raw samples", "Every format", "Millions of small files")),
    ("adaptors.md", "PyTorch, TensorFlow and C++", ("PyTorch, TensorFlow and C++", "Your own Dataset")),
    ("preemption.md", "Preemption and elastic restarts", ("Preemption and elastic restarts",)),
    ("peers.md", "The peer tier", ("Beyond one node",)),
    ("cli.md", "Command line", ("Command line",)),
    ("layout.md", "Source layout", ("Layout",)),
]


def sections(text: str) -> List[Tuple[int, str, List[str]]]:
    """(level, title, lines) for the text before the first heading (level 0, title '') and each
    level-2 or level-3 section; headings inside code blocks are not headings."""
    out: List[Tuple[int, str, List[str]]] = [(0, "", [])]
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        m = None if fenced else re.match(r"^(##|###) (.*)$", line)
        if m:
            out.append((len(m.group(1)), m.group(2).strip(), []))
        else:
            out[-1][2].append(line)
    return out


def page_of(title: str, level: int, parent: str) -> str:
    if level == 0:
        return "index.md"
    for file, _, prefixes in PAGES[1:]:
        if any(title.startswith(p) for p in prefixes):
            return file
    if level == 3:
        return parent
    raise SystemExit(f"docs_pages: README section '{title}' is on no page (scripts/docs_pages.py, PAGES)")


def benchmark_pages(docs: Path) -> List[Tuple[str, str]]:
    """Writes benchmarks/RESULTS.md as results.md, each benchmarks/notes/*.md as notes/NAME.md and
    the plots as plots/*.png, so that their relative links hold (the notes' ``../RESULTS.md`` becomes
    ``../results.md``); returns (file, title) of the notes, in name order."""
    bench = ROOT / "benchmarks"
    (docs / "results.md").write_text((bench / "RESULTS.md").read_text())
    (docs / "notes").mkdir()
    notes = []
    for page in sorted((bench / "notes").glob("*.md")):
        text = page.read_text()
        first = text.splitlines()[0] if text else ""
        if not first.startswith("# "):
            raise SystemExit(f"docs_pages: {page.relative_to(ROOT)} does not start with a title ('# ...')")
        (docs / "notes" / page.name).write_text(text.replace("](../RESULTS.md", "](../results.md"))
        notes.append((f"notes/{page.name}", re.sub(r"^Lab notes:\s*", "", first[2:].strip())))
    (docs / "plots").mkdir()
    for plot in sorted((bench / "plots").glob("*.png")):
        shutil.copy(plot, docs / "plots" / plot.name)
    return notes


def main(out: Path) -> int:
    readme = (ROOT / "README.md").read_text()
    pages: Dict[str, List[str]] = {file: [] for file, _, _ in PAGES}
    used = set()
    parent = "index.md"
    for level, title, lines in sections(readme):
        file = page_of(title, level, parent)
        if level == 2:
            parent = file
        used.update(p for _, _, prefixes in PAGES for p in prefixes if level and title.startswith(p))
        body = pages[file]
        if level:
            depth = 1 if not body else level - 1
            body.append("#" * depth + " " + title)
        body.extend(lines)
    unused = [p for _, _, prefixes in PAGES[1:] for p in prefixes if p not in used]
    if unused:
        raise SystemExit(f"docs_pages: no README section starts with {unused} (scripts/docs_pages.py, PAGES)")
    docs = out / "docs"
    if docs.exists():
        shutil.rmtree(docs)
    docs.mkdir(parents=True)
    first = pages["index.md"]
    while first and not first[0].strip():
        first.pop(0)
    if first and first[0].startswith("# "):
        first[0] = "# prestage"
    for file, lines in pages.items():
        (docs / file).write_text("\n".join(lines).strip() + "\n")
    # The site's own pages (the API reference) and the benchmark results as they are.
    for page in sorted((ROOT / "docs").glob("*.md")):
        shutil.copy(page, docs / page.name)
    notes = benchmark_pages(docs)
    nav = [f"  - {title}: {file}" for file, title, _ in PAGES]
    nav += ["  - API reference: api.md", "  - Benchmark results: results.md", "  - Lab notes:"]
    nav += [f"    - {title}: {file}" for file, title in notes]
    config = (ROOT / "docs" / "mkdocs.yml").read_text().replace("@NAV@", "\n".join(nav))
    config = config.replace("@PACKAGE@", str(ROOT / "python"))
    (out / "mkdocs.yml").write_text(config)
    print(f"docs_pages: {len(pages) + 2 + len(notes)} pages into {docs}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1])))
