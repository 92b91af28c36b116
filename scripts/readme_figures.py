"""Regenerate the README's figures from real runs (docs/*.png).

    python scripts/readme_figures.py

The quick-start Gantt (16 ranks of pure data parallelism), the 3D-parallel
1F1B Gantt (two ranks of each of the four stages, with its breakdown panel),
the 3D run's memory over time, and the same run with 1F1B and with GPipe on
one time axis (what ``clustersim compare`` draws).
"""

from __future__ import annotations

from pathlib import Path

from simulator import run
from simulator.outputs.gantt import compare_figure
from simulator.outputs.style import save

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def main() -> None:
    quickstart = run(ROOT / "scripts" / "scenarios" / "quickstart.yaml")
    quickstart.gantt(str(DOCS / "quickstart-gantt.png"))
    pipeline = run(ROOT / "scripts" / "scenarios" / "gpt3-6.7b-3d.yaml")
    pipeline.gantt(str(DOCS / "pipeline-gantt.png"), ranks=[0, 1, 8, 9, 16, 17, 24, 25])
    pipeline.memory_plot(str(DOCS / "pipeline-memory.png"))
    gpipe = run(ROOT / "scripts" / "scenarios" / "gpt3-6.7b-3d.yaml",
                ("parallelism.schedule=gpipe",))
    save(compare_figure(pipeline.spans, gpipe.spans, ("1F1B", "GPipe"), ranks=[0, 8, 16, 24]),
         DOCS / "compare-1f1b-gpipe.png")
    for name in ("quickstart-gantt.png", "pipeline-gantt.png", "pipeline-memory.png",
                 "compare-1f1b-gpipe.png"):
        print(DOCS / name)


if __name__ == "__main__":
    main()
