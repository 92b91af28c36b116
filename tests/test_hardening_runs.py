"""Hardening, round 3 (issue 55), item 1 and its done-when: the simplest scenario
of all (one GPU, nothing to communicate) runs end to end, and random small valid
scenarios on 1, 2 and 8 GPUs always end in a result that holds together."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.cli import main
from simulator.engine.call_log import ROW_DTYPES, CallLog
from simulator.engine.records import COLLECTIVE_COLUMNS

ONE_GPU = {"name": "one-gpu", "cluster": {"preset": "dgx-a100", "nodes": 1, "gpus_per_node": 1},
           "model": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000},
           "training": {"seq_len": 128, "global_batch": 4, "micro_batch": 1},
           "parallelism": {"tp": 1, "pp": 1, "dp": 1}}


def test_an_empty_communication_log_has_the_columns_and_types_of_a_full_one():
    """No row at all (a run with no communication) still gives typed columns, so
    arithmetic on times and grouping by text work as on any other log."""
    empty = CallLog().frame(COLLECTIVE_COLUMNS)
    assert list(empty.columns) == list(COLLECTIVE_COLUMNS) and empty.empty
    assert [str(t) for t in empty.dtypes] == list(ROW_DTYPES)
    assert (empty["start"] - empty["first_arrival"]).dtype == float


def test_a_one_gpu_run_works_and_shows_an_empty_communication_log(tmp_path, capsys):
    """Item 1: one GPU used to exit 3 (``'Categorical' - 'Categorical'``)."""
    path = tmp_path / "one.yaml"
    path.write_text(yaml.safe_dump(ONE_GPU))
    out = tmp_path / "out"
    assert main(["run", str(path), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "MFU" in printed and "on 1 GPU\n" in printed and "exposed comm 0.0 ns" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["gpus"] == 1 and summary["exposed_comm_s"] == 0
    assert (out / "comms.csv").read_text().startswith("dimension,group,")
    assert len((out / "comms.csv").read_text().splitlines()) == 1  # the header only
    for command in (["comms", str(out), "--plot", str(tmp_path / "c.png")],
                    ["blame", str(out)], ["gantt", str(out), "--out", str(tmp_path / "g.png")],
                    ["compare", str(out), str(out)],
                    ["export-chakra", str(out), "--out", str(tmp_path / "chakra")]):
        assert main(command) == 0, command
    printed = capsys.readouterr().out
    assert "none: no rank sends or receives anything" in printed
    assert "none: the run has no collective calls" in printed


@pytest.mark.parametrize("experts", [0, 4])
def test_a_one_gpu_run_is_its_compute(experts):
    """With nothing to wait for, the iteration ends with the rank's last kernel;
    a MoE layer's exchanges over one rank are none (they used to be logged as
    all-to-alls of one member)."""
    raw = copy.deepcopy(ONE_GPU)
    if experts:
        raw["model"].update(experts=experts, top_k=2, expert_ffn_hidden=256)
    result = run(raw)
    assert result.comms.empty and result.summary["gpus"] == 1
    assert result.summary["exposed_comm_s"] == 0 and result.summary["bubble_s"] == 0
    busy = result.spans[result.spans["stream"] == "compute"]
    assert busy["end"].max() == pytest.approx(result.summary["iteration_time_s"])


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def small_scenarios(draw) -> dict:
    """A valid scenario on 1, 2 or 8 GPUs of one server: any split of the GPUs
    over tp, cp, pp and dp, a schedule, a ZeRO stage, a precision."""
    gpus = draw(st.sampled_from([1, 2, 8]))
    tp = draw(st.sampled_from(_divisors(gpus)))
    cp = draw(st.sampled_from(_divisors(gpus // tp)))
    pp = draw(st.sampled_from([p for p in _divisors(gpus // tp // cp) if p <= 4]))
    dp = gpus // tp // cp // pp
    micro = draw(st.sampled_from([1, 2]))
    per_rank = draw(st.sampled_from([1, 2, 4]))
    parallelism = {"tp": tp, "cp": cp, "pp": pp, "dp": dp,
                   "schedule": draw(st.sampled_from(["1f1b", "gpipe"])),
                   "zero": draw(st.sampled_from([0, 1, 2, 3])) if dp > 1 else 0}
    model = {"layers": 4, "hidden": 256, "heads": 8, "vocab": 1024}
    moe = draw(st.booleans())
    if moe:  # a MoE model, its experts over some of the data-parallel ranks
        model.update(experts=4, top_k=2, expert_ffn_hidden=256)
        parallelism["ep"] = draw(st.sampled_from([e for e in _divisors(dp) if e <= 4]))
    if tp > 1:  # (Megatron-Core requires sequence parallelism in MoE layers)
        parallelism["sequence_parallel"] = moe or draw(st.booleans())
    return {"name": f"g{gpus}-tp{tp}-cp{cp}-pp{pp}-dp{dp}", "seed": draw(st.integers(0, 3)),
            "cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": gpus,
                        "compute_jitter": draw(st.sampled_from([0, 0.02]))},
            "model": model,
            "training": {"seq_len": 256, "global_batch": micro * per_rank * dp,
                         "micro_batch": micro,
                         "precision": draw(st.sampled_from(["bf16", "fp8"]))},
            "parallelism": parallelism}


def _no_overlap_per_stream(spans) -> bool:
    for _, lane in spans.groupby(["rank", "stream"], observed=True):
        start, end = lane["start"].to_numpy(), lane["end"].to_numpy()
        order = np.lexsort((end, start))
        if np.any(start[order][1:] < end[order][:-1] - 1e-12):
            return False
    return True


@settings(max_examples=16, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(small_scenarios())
def test_random_small_valid_scenarios_run_and_hold_together(raw):
    """Every small valid scenario gives a finite iteration, spans that never
    overlap on one stream, and communication exactly when some group has two
    or more members."""
    result = run(raw)
    summary = result.summary
    assert np.isfinite(summary["iteration_time_s"]) and summary["iteration_time_s"] > 0
    assert 0 < summary["mfu"] < 1
    assert (result.spans["end"] >= result.spans["start"]).all()
    assert _no_overlap_per_stream(result.spans)
    assert result.comms.empty == (summary["gpus"] == 1)
    assert (result.comms["end"] >= result.comms["start"]).all()
    assert (result.comms["wait"] >= 0).all()
