"""MkDocs hook: before the site's files are collected, write the pages made
from elsewhere, so none is written twice: the reference pages generated from
the code (``simulator.cli.reference``) into ``docs/reference/`` (committed too,
so the README's links resolve; ``tests/test_reference.py`` fails when they are
stale), the home page from the README (its links into ``docs/`` made
relative) and the benchmarks' page from ``benchmarks/README.md`` (neither
committed)."""

from __future__ import annotations

from pathlib import Path


def on_pre_build(config, **kwargs) -> None:
    from simulator.cli.reference import write

    docs = Path(config["docs_dir"])
    write(docs / "reference")
    readme = (docs.parent / "README.md").read_text()
    (docs / "index.md").write_text(readme.replace("](docs/", "]("))
    (docs / "benchmarks.md").write_text((docs.parent / "benchmarks" / "README.md").read_text())
