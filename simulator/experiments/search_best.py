"""The search's answer, ready to use: the best layout's scenario file and run
directory (Gantt chart included), and why it beats the runner-up.

``explain`` splits each run's iteration, on its critical rank, into compute
without recompute, recompute, the pipeline bubble, the communication each
parallel dimension leaves exposed (tensor, context, data, pipeline), waiting
for other ranks, and the rest; the difference per part says where the
winner's advantage comes from.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from simulator.config.scenario import from_dict
from simulator.experiments.layouts import Layout
from simulator.runner.result import RunResult
from simulator.runner.simulate import run
from workloads.program import DIMENSIONS

STREAMS = tuple(dict.fromkeys(d.stream for d in DIMENSIONS))  # each dimension's stream, once
PARTS = ("compute", "recompute", "bubble", *(f"exposed {s}" for s in STREAMS), "waiting",
         "other")


def scenario_of(base: Mapping[str, Any], layout: Layout, name: str) -> dict[str, Any]:
    """The user's base scenario with ``layout`` (its other keys kept)."""
    raw = layout.scenario(base)
    raw["name"] = name
    return raw


def write_scenario(raw: Mapping[str, Any], path: Path) -> Path:
    """A scenario file a user can run as it is (``clustersim run PATH``)."""
    text = yaml.safe_dump(dict(raw), sort_keys=False, default_flow_style=None)
    path.write_text("# written by clustersim search: the fastest layout that fits\n" + text)
    return path


def run_layout(base: Mapping[str, Any], layout: Layout, base_dir: Path | None,
               name: str) -> RunResult:
    return run(from_dict(scenario_of(base, layout, name), base_dir=base_dir))


def parts(result: RunResult) -> dict[str, float]:
    """Seconds of the iteration per part (``PARTS``) on the critical rank."""
    s = result.summary
    rank = s["critical_rank"]
    streams = result.streams()
    mine = streams[streams["rank"] == rank].set_index("stream")["exposed_s"]
    model_flops = s["model_tflops_per_gpu"] * 1e12 * s["gpus"] * s["iteration_time_s"]
    share = max(0.0, 1.0 - model_flops / s["hardware_flops"]) if s["hardware_flops"] else 0.0
    out = {"compute": s["compute_s"] * (1 - share), "recompute": s["compute_s"] * share,
           "bubble": s["bubble_s"], "waiting": s["comm_wait_s"]}
    for stream in STREAMS:
        out[f"exposed {stream}"] = float(mine.get(stream, 0.0))
    out["other"] = s["iteration_time_s"] - sum(out.values())
    return {part: out[part] for part in PARTS}


def explain(best: RunResult, second: RunResult, names: tuple[str, str]) -> pd.DataFrame:
    """The two runs' parts side by side, the largest differences first."""
    a, b = parts(best), parts(second)
    table = pd.DataFrame({"part": list(PARTS), names[0]: [a[p] for p in PARTS],
                          names[1]: [b[p] for p in PARTS]})
    table["difference_s"] = table[names[1]] - table[names[0]]
    total = {"part": "iteration", names[0]: best.summary["iteration_time_s"],
             names[1]: second.summary["iteration_time_s"]}
    total["difference_s"] = total[names[1]] - total[names[0]]
    table = table.reindex(table["difference_s"].abs().sort_values(ascending=False).index)
    return pd.concat([pd.DataFrame([total]), table], ignore_index=True)


def summary_line(table: pd.DataFrame) -> str:
    """One sentence: how much faster, and the two parts that differ most."""
    total = table.iloc[0]["difference_s"]
    said = ", ".join(f"{row.part} {row.difference_s * 1e3:+.1f} ms"
                     for row in table.iloc[1:3].itertuples())
    return (f"the winner is {total * 1e3:.1f} ms faster per iteration; the parts that "
            f"differ most (runner-up minus winner): {said}")
