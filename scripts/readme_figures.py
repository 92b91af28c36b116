"""Regenerate the README's figures from real runs (docs/*.png).

    python scripts/readme_figures.py

The quick-start Gantt (16 ranks of pure data parallelism), the 3D-parallel
1F1B Gantt (two ranks of each of the four stages, with its breakdown panel),
the 3D run's memory over time, and the same run with 1F1B and with GPipe on
one time axis (what ``clustersim compare`` draws), the layout search's
figure for GPT-3 6.7B on 32 A100 (``clustersim search ... --top 6``), and a
MoE layer's all-to-alls with and without Megatron-Core's combined 1F1B
overlap (``scripts/scenarios/moe-deepep-overlap.yaml``: DeepEP's two hops),
and the same kind of model under plain 1F1B and DeepSeek's DualPipe
(``scripts/scenarios/moe-dualpipe.yaml``: one rank of each stage).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
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
    search_example()
    moe = ROOT / "scripts" / "scenarios" / "moe-deepep-overlap.yaml"
    overlap, plain = run(moe), run(moe, ("parallelism.moe_overlap=none",))
    save(compare_figure(plain.spans, overlap.spans,
                        ("plain 1F1B", "combined 1F1B (moe_overlap: 1f1b)"), ranks=[0],
                        start=0.04, end=0.09), DOCS / "moe-overlap-gantt.png")
    dual = ROOT / "scripts" / "scenarios" / "moe-dualpipe.yaml"
    save(compare_figure(run(dual, ("parallelism.moe_overlap=none",)).spans, run(dual).spans,
                        ("plain 1F1B", "DualPipe (moe_overlap: dualpipe)"),
                        ranks=[0, 8, 16, 24]), DOCS / "moe-dualpipe-gantt.png")
    for name in ("quickstart-gantt.png", "pipeline-gantt.png", "pipeline-memory.png",
                 "compare-1f1b-gpipe.png", "search-example.png", "moe-overlap-gantt.png",
                 "moe-dualpipe-gantt.png"):
        print(DOCS / name)


def search_example() -> None:
    """The README's search: the 3D scenario's default space, the top 6 simulated,
    as the command runs it."""
    with tempfile.TemporaryDirectory() as folder:
        subprocess.run([sys.executable, "-m", "simulator", "search",
                        str(ROOT / "scripts" / "scenarios" / "gpt3-6.7b-3d.yaml"), "--top", "6",
                        "--out", folder], check=True, capture_output=True)
        shutil.copy(Path(folder) / "search.png", DOCS / "search-example.png")


if __name__ == "__main__":
    main()
