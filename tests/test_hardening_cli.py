"""Issue 55's CLI, cluster and run-table items: an NVLink domain of whole
servers, ``init``'s flags each checked and named, several scenarios in one
``run`` each with its row and no empty folders, low precision per job, and
the small ones (``--no-trace``'s reason, a job's GPUs against the cluster's,
``collective --op`` completion, YAML 1.1 booleans in string fields)."""

from __future__ import annotations

import pytest

from simulator.base.fields import ScenarioError
from simulator.config.scenario import machine_from

# -- item 10: an NVLink domain is whole servers -------------------------------------


@pytest.mark.parametrize(("preset", "domain", "per_server"), [
    ("gb200-nvl72", 6, 4), ("gb200-nvl72", 3, 4), ("gb200-nvl72", 18, 4),
    ("dgx-a100", 1, 8), ("dgx-a100", 4, 8), ("dgx-h100", 12, 8)])
def test_a_domain_that_splits_a_server_is_refused(preset, domain, per_server):
    with pytest.raises(ScenarioError, match=(
            rf"^cluster.nvlink_domain: {domain} must be whole servers: a multiple of the "
            rf"{per_server} GPUs per server \({per_server}, {2 * per_server}, ")):
        machine_from({"preset": preset, "nodes": 4, "nvlink_domain": domain})


@pytest.mark.parametrize(("preset", "domain"), [("gb200-nvl72", 8), ("gb200-nvl72", 36),
                                                ("dgx-h100", 16), ("dgx-a100", 8)])
def test_a_domain_of_whole_servers_is_accepted(preset, domain):
    assert machine_from({"preset": preset, "nodes": 4, "nvlink_domain": domain}).gpus > 0


def test_the_reference_no_longer_offers_a_domain_of_zero():
    from simulator.base.field_docs import descriptions
    from topologies.clusters import ClusterSpec

    text = descriptions(ClusterSpec)["nvlink_domain"]
    assert "0:" not in text and "whole number of servers" in text
