"""Re-run every ``clustersim validate`` table of the accuracy page
(``docs/accuracy.md``: the blocks between ``<!-- validate ARGS -->`` and
``<!-- /validate -->``) and write what it prints now; say how many changed.

    python scripts/refresh_accuracy.py            # minutes: the whole validation set
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

from simulator.cli import main
from simulator.cli.reference import refresh_accuracy

PAGE = Path(__file__).resolve().parent.parent / "docs" / "accuracy.md"


def validate(args: list[str]) -> str:
    """What ``clustersim validate ARGS`` prints (it must succeed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["validate", *args])
    if code:
        sys.exit(f"clustersim validate {' '.join(args)} failed ({code})")
    return out.getvalue()


if __name__ == "__main__":
    print(f"{refresh_accuracy(PAGE, validate)} table(s) of {PAGE} changed")
