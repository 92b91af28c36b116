"""GPU data files (issue 38, first part): today's GPUs load with their cited
figures, short names work from a scenario, and assumed efficiencies are said."""

import pytest

from simulator import run
from simulator.config.scenario import ScenarioError, from_dict
from tests.test_parallelism import tiny
from topologies.clusters import CLUSTERS
from topologies.gpus import GPUS, GpuFileError, load_gpu

# (name, dense bf16 TFLOP/s, fp8, fp4 or None, GB, TB/s, NVLink generation, GB/s per direction)
DATASHEETS = [("b200-sxm-180gb", 2250, 4500, 9000, 180, 8.0, 5, 900),
              ("gb200-186gb", 2500, 5000, 10000, 186, 8.0, 5, 900),
              ("gb300-288gb", 2500, 5000, 15000, 288, 8.0, 5, 900),
              ("h800-sxm-80gb", 989, 1979, None, 85.9, 3.35, 4, 200)]


@pytest.mark.parametrize("row", DATASHEETS, ids=lambda r: r[0])
def test_todays_gpus_carry_their_datasheet_figures(row):
    name, bf16, fp8, fp4, gb, tbs, generation, nvlink = row
    gpu = GPUS[name]
    assert gpu.peak("bf16") == bf16 * 1e12 and gpu.peak("fp8") == fp8 * 1e12
    assert gpu.peak_flops.get("nvfp4") == (fp4 * 1e12 if fp4 else None)
    assert gpu.peak_flops.get("mxfp8") == (fp8 * 1e12 if fp4 else None)  # MX: the FP8 rate
    assert gpu.memory_bytes == pytest.approx(gb * 1e9, rel=1e-3)
    assert gpu.hbm_bandwidth == tbs * 1e12
    assert (gpu.nvlink_generation, gpu.nvlink_bandwidth) == (generation, nvlink * 1e9)
    assert GPUS[name.split("-")[0]] is gpu  # the short name: gpu: b200


def test_presets_for_b200_and_h800_servers():
    assert CLUSTERS["dgx-b200"].gpu == "b200-sxm-180gb"
    assert CLUSTERS["dgx-b200"].nvlink_bandwidth == GPUS["b200"].nvlink_bandwidth
    assert CLUSTERS["dgx-h800"].nvlink_bandwidth == GPUS["h800"].nvlink_bandwidth


def test_a_b200_run_says_its_efficiencies_are_assumed_and_is_faster_than_h100():
    scenario = tiny(tp=8, cluster__preset="dgx-b200", cluster__nodes=1)
    b200 = run(scenario).summary
    assert "efficiencies assumed" in b200["compute_model"]
    h100 = run(tiny(tp=8, cluster__preset="dgx-h100", cluster__nodes=1)).summary
    assert "assumed" not in h100["compute_model"]
    assert b200["iteration_time_s"] < h100["iteration_time_s"]


def test_the_short_name_picks_the_gpu_and_a_wrong_one_lists_them():
    scenario = from_dict(tiny(cluster__preset="dgx-h100", cluster__gpu="gb300"))
    assert scenario.gpu.name == "gb300-288gb"
    with pytest.raises(ScenarioError, match=r"cluster\.gpu: 'b300' is not one of: .*gb300"):
        from_dict(tiny(cluster__gpu="b300"))


def test_a_gpu_file_with_a_bad_nvlink_figure_is_refused(tmp_path):
    from pathlib import Path
    text = Path(GPUS["b200"].notes).read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("bytes_per_s_per_direction: 9.0e+11",
                                "bytes_per_s_per_direction: -1"))
    with pytest.raises(GpuFileError, match="nvlink_bandwidth -1 must be a number >= 0"):
        load_gpu(bad)
