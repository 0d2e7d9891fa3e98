#!/usr/bin/env bash
# Builds the documentation site (MkDocs) from the repository, warnings as errors:
#
#   scripts/docs.sh OUTDIR      then open OUTDIR/index.html
#
# The pages are the README's sections (scripts/docs_pages.py cuts them by heading), the API reference
# generated from the package's docstrings and type stubs (mkdocstrings; nothing is imported or
# built), and benchmarks/RESULTS.md with the lab notes of benchmarks/notes/. MkDocs and its
# plug-ins live in their own environment in the cache (PRESTAGE_DOCS_CACHE, default
# ~/.cache/prestage-docs), outside the repository.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
out=$(realpath -m "$1")
cache=${PRESTAGE_DOCS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/prestage-docs}
venv=$cache/venv
# Pinned: a newer plug-in may warn where this one did not, and warnings fail the build.
packages=(mkdocs==1.6.1 mkdocstrings==1.0.8 mkdocstrings-python==2.0.11)
stamp="${packages[*]}"
if [ "$(cat "$venv/.packages" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q "${packages[@]}"
  echo "$stamp" > "$venv/.packages"
fi
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
"$venv/bin/python" "$root/scripts/docs_pages.py" "$src"
# Not -q: with it, mkdocs 1.6 no longer fails a strict build on a warning.
"$venv/bin/mkdocs" build --strict --clean -f "$src/mkdocs.yml" -d "$out"
echo "documentation: $out/index.html"
