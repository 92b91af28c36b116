"""Run the whole validation set once and rewrite every ``clustersim validate``
table of the accuracy page (``docs/accuracy.md``) and the README (the blocks
between ``<!-- validate ARGS -->`` and ``<!-- /validate -->``) with what
``clustersim validate ARGS --markdown`` prints for those rows; say how many
changed. Each case is simulated once, however many tables show it.

    python scripts/refresh_accuracy.py            # minutes: the whole validation set
"""

from __future__ import annotations

import sys
from pathlib import Path

from simulator.cli.reference import refresh_accuracy
from simulator.cli.validate import block
from simulator.experiments.validate import load_cases, run_cases

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "docs" / "accuracy.md", ROOT / "README.md")


if __name__ == "__main__":
    cases = load_cases()
    table = run_cases(cases, lambda c: print(f"  {c.name} ...", file=sys.stderr, flush=True))
    for page in PAGES:
        changed = refresh_accuracy(page, lambda args: block(table, cases, args))
        print(f"{changed} table(s) of {page} changed")
