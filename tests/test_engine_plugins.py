"""Each engine plug-in against the reference core, on the same program: its contract.

The reference ``Engine`` spends one event per kernel and runs every rank; a
plug-in (``simulator.engine.assemble.PLUGINS``) may plan ahead or run fewer
ranks, but every span it produces (after expanding to every rank) must end
when the reference's does, and the communication log must hold the same calls.
"""

import pandas as pd
import pytest

from simulator.collectives.tuner import Collectives
from simulator.config.scenario import from_dict
from simulator.engine.assemble import PLUGINS, engine_class, valid, valid_plans
from simulator.engine.core import Engine
from simulator.engine.gangs import program_classes, tensor_parallel_gangs
from simulator.engine.link_sharing import alone_calls, exclusive_dimensions
from simulator.engine.records import COLLECTIVE_COLUMNS
from simulator.network.fabric import Fabric
from simulator.runner.result import span_table
from simulator.runner.setup import compute_model
from tests.test_parallelism import tiny
from workloads.program import build_program

# every plan a run may use (the method choice builds no other), and gangs on their
# own, the part that call_groups and exclusive_links build on
COMBINATIONS = [*valid_plans(), ("gangs",), ("batching", "gangs")]
PIPELINES = [dict(tp=8, pp=2), dict(tp=8, pp=2, schedule="interleaved", virtual_stages=2,
                                    sequence_parallel=True),
             dict(tp=8, pp=2, training__recompute="full", training__micro_batch=2),
             dict(tp=8, pp=2, dp=2, zero=1, cluster__nodes=4)]
# the combined 1F1B schedule: steps of a forward and a backward of two micro-batches,
# each one's all-to-alls under the other's compute (not replayed: the all-to-alls'
# links are never exclusive; the builder's side of the steps' contract holds)
COMBINED = dict(pp=2, ep=4, schedule="interleaved", virtual_stages=2, moe_overlap="1f1b",
                model__experts=4, model__top_k=2, model__expert_ffn_hidden=512,
                model__routing="balanced")


def _setup(parallelism: dict):
    scenario = from_dict(tiny(**parallelism))
    fabric = Fabric(scenario.machine.build_graph())
    program = build_program(scenario.model, scenario.training, scenario.parallel)
    placement = fabric.graph.graph["gpus"][:program.ranks]
    model = compute_model(scenario)
    return program, placement, fabric, (lambda rank: model.durations(program.ops[rank]))


def _spans(result, nodes) -> pd.DataFrame:
    spans = span_table(result, list(nodes))  # the engine's tuples and replayed steps
    return spans if result.expand is None else result.expand(spans, nodes=nodes)


@pytest.mark.parametrize("names", COMBINATIONS, ids=lambda names: "+".join(names) or "core")
@pytest.mark.parametrize("parallelism", [dict(tp=8, dp=2), dict(tp=2, pp=2, dp=4)],
                         ids=["tp8-dp2", "tp2-pp2-dp4"])
def test_a_plugin_gives_the_reference_timeline(names, parallelism):
    program, placement, fabric, durations = _setup(parallelism)
    options = {}
    if "gangs" in names:  # with call groups: a stage's class, which holds whole groups
        options["represents"] = (program_classes(program) if "call_groups" in names else
                                 tensor_parallel_gangs(program))
    if "exclusive_links" in names:
        options["exclusive"], options["late"] = exclusive_dimensions(program, fabric,
                                                                     placement)
    nodes = pd.Series([fabric.node_of(g) for g in placement]).to_numpy()
    reference = Engine(program, placement, durations, fabric, Collectives(fabric)).run()
    fast = engine_class(*names)(program, placement, durations, fabric, Collectives(fabric),
                                **options).run()
    a, b = _spans(reference, nodes), _spans(fast, nodes)
    a = a[a["rank"].isin(b["rank"].unique())].reset_index(drop=True)
    if "layer_spans" in names:  # a layer's kernels are one span: the rest span for span
        assert b["end"].max() == pytest.approx(a["end"].max(), rel=1e-12)
        a, b = (x[x["kind"] != "compute"].astype({"kind": str, "name": str}).reset_index(
            drop=True) for x in (a, b))
    assert len(a) == len(b) and (a["rank"] == b["rank"]).all()
    assert (a["kind"] == b["kind"]).all() and (a["name"] == b["name"]).all()
    assert b["end"].to_numpy() == pytest.approx(a["end"].to_numpy(), rel=1e-9)
    if "folding" not in names:  # folded ranks' calls are not logged
        assert len(fast.collectives) == len(reference.collectives)
    assert fast.events <= reference.events


@pytest.mark.parametrize("parallelism", [dict(tp=8, dp=2), dict(tp=2, pp=2, dp=4)],
                         ids=["tp8-dp2", "tp2-pp2-dp4"])
def test_call_groups_run_a_gangs_groups_as_one_batch_with_the_same_log(parallelism):
    """A stage's class holds whole tensor- and data-parallel groups: its calls run as
    one batch each (fewer events than a call per group), and every call is logged
    with the reference's start and end (the log sorted by call)."""
    program, placement, fabric, durations = _setup(parallelism)
    runs = {names: engine_class(*names)(program, placement, durations, fabric,
                                        Collectives(fabric),
                                        represents=program_classes(program)).run()
            for names in [("batching", "gangs"), ("batching", "gangs", "call_groups")]}
    reference = Engine(program, placement, durations, fabric, Collectives(fabric)).run()
    (_, gangs), (_, grouped) = runs.items()
    assert grouped.events < 0.7 * gangs.events
    keys = ["group", "group_index", "seq"]
    expected = reference.collectives.frame(COLLECTIVE_COLUMNS).sort_values(keys)
    got = grouped.collectives.frame(COLLECTIVE_COLUMNS).sort_values(keys)
    assert len(got) == len(expected)
    for column in ("collective", "name", "ranks", "bytes", "algorithm", "channels"):
        assert got[column].astype(str).tolist() == expected[column].astype(str).tolist()
    for column in ("first_arrival", "start", "end"):
        assert got[column].to_numpy() == pytest.approx(expected[column].to_numpy(), rel=1e-9)


def _same_memory(mine: list, theirs: list) -> None:
    mine, theirs = sorted(mine), sorted(theirs)  # times from offsets: last bits differ
    assert [e[1:] for e in mine] == [e[1:] for e in theirs]
    assert [e[0] for e in mine] == pytest.approx([e[0] for e in theirs], rel=1e-9)


@pytest.mark.parametrize("driven", [False, True], ids=["processes", "driven"])
@pytest.mark.parametrize("parallelism", PIPELINES, ids=str)
def test_replayed_steps_give_the_reference_timeline(parallelism, driven):
    """Pipelines whose tensor-parallel calls are exclusive: most steps are replayed
    from their kind's template, and every span, log row and memory event equals
    the reference engine's (every call on the same row its span names); with
    ``pipeline_streams`` the representatives' compute and pipeline streams run
    without processes, to the same timeline."""
    program, placement, fabric, durations = _setup(parallelism)
    exclusive, late = exclusive_dimensions(program, fabric, placement)
    options = {"represents": tensor_parallel_gangs(program), "exclusive": exclusive,
               "late": late}
    assert exclusive == {"tp"} and not late
    plugins = ("batching", "gangs", "exclusive_links", "passes") + (
        ("pipeline_streams",) if driven else ())
    _same_timeline(program, placement, fabric, durations, plugins, options)


@pytest.mark.parametrize("parallelism", [
    dict(tp=4, cp=2, pp=2, dp=2, zero=1, cluster__nodes=4, bucket_size="1 MB"),
    dict(tp=4, cp=2, pp=2, dp=2, zero=1, schedule="interleaved", virtual_stages=2,
         sequence_parallel=True, cluster__nodes=4),
    dict(tp=4, cp=2, pp=2, dp=2, sequence_parallel=True, cluster__nodes=4,
         training__recompute="full", bucket_size="1 MB")], ids=str)
def test_context_parallel_pipelines_run_alone_until_their_reductions(parallelism):
    """Tensor- and context-parallel calls sharing servers with data-parallel
    groups (over dp x cp): the calls that the reductions may overlap run on the
    network (``link_sharing.alone_calls``), every other one alone, and most steps
    are replayed; the timeline, log and memory are the reference engine's."""
    program, placement, fabric, durations = _setup(parallelism)
    exclusive, late = exclusive_dimensions(program, fabric, placement)
    assert exclusive == {"tp", "cp"} and late == {"dp"}
    shared = alone_calls(program.ops[0], exclusive, late)
    calls = [i for i, op in enumerate(program.ops[0]) if op.group in exclusive]
    assert 0 < len(shared) < len(calls) / 2  # the drain's, not the others
    options = {"represents": program_classes(program), "exclusive": exclusive, "late": late}
    plugins = ("batching", "gangs", "call_groups", "exclusive_links", "passes",
               "pipeline_streams")
    _same_timeline(program, placement, fabric, durations, plugins, options)


def _same_timeline(program, placement, fabric, durations, plugins, options) -> None:
    """Run ``plugins`` and the reference engine: the same spans (the replayed steps'
    included), log rows and memory events."""
    nodes = pd.Series([fabric.node_of(g) for g in placement]).to_numpy()
    reference = Engine(program, placement, durations, fabric, Collectives(fabric)).run()
    fast = engine_class(*plugins)(program, placement, durations, fabric, Collectives(fabric),
                                  **options).run()
    assert fast.steps_replayed > len(program.steps[0]) / 2
    log_a = reference.collectives.frame(COLLECTIVE_COLUMNS)
    log_b = fast.collectives.frame(COLLECTIVE_COLUMNS)
    a, b = _spans(reference, nodes), _spans(fast, nodes)
    a = a[a["rank"].isin(b["rank"].unique())].reset_index(drop=True)
    assert len(a) == len(b)
    for column in ("rank", "stream", "kind", "name", "phase", "microbatch", "layer", "bytes"):
        assert (a[column].astype(object) == b[column].astype(object)).all(), column
    for column in ("start", "end"):
        assert b[column].to_numpy() == pytest.approx(a[column].to_numpy(), rel=1e-9)
    named_a, named_b = a["call"] >= 0, b["call"] >= 0
    assert (named_a == named_b).all()
    rows = ["group", "group_index", "collective", "bytes", "start"]
    assert (log_a.loc[a["call"][named_a], rows].to_numpy()[:, :4] ==
            log_b.loc[b["call"][named_b], rows].to_numpy()[:, :4]).all()
    assert log_b.loc[b["call"][named_b], "start"].to_numpy() == pytest.approx(
        log_a.loc[a["call"][named_a], "start"].to_numpy(), rel=1e-9)
    for mine, theirs in zip(fast.memory_events, reference.memory_events, strict=True):
        if mine:
            _same_memory(mine, theirs)


@pytest.mark.parametrize("parallelism", PIPELINES + [
    dict(pp=2, dp=8, zero=3), dict(pp=2, cp=2, dp=4), dict(pp=4, dp=4, schedule="gpipe"),
    dict(pp=2, dp=8, stage_layers=[3, 5]), dict(pp=2, dp=8, fsdp={"sharding": "full_shard"}),
    COMBINED],
    ids=str)
def test_steps_of_one_key_hold_the_same_ops(parallelism):
    """``Program.steps``' contract, which the replay relies on: two steps with one
    key have the same ops but for their micro-batch and their dependencies on ops
    before the step."""
    program = _setup(parallelism)[0]
    for ops, steps in {id(o): (o, s) for o, s in zip(program.ops, program.steps,
                                                      strict=True)}.values():
        first_of: dict = {}
        for first, end, key in steps:
            like = first_of.setdefault(key, (first, end))
            assert end - first == like[1] - like[0]
            for i, j in zip(range(first, end), range(*like), strict=True):
                a, b = ops[i], ops[j]
                assert a._replace(microbatch=0, deps=()) == b._replace(microbatch=0, deps=())
                assert [d - first for d in a.deps if d >= first] == [
                    d - like[0] for d in b.deps if d >= like[0]]


def test_layer_spans_keep_every_memory_event_and_the_end():
    program, placement, fabric, durations = _setup(dict(tp=2, pp=2, dp=4))
    reference = Engine(program, placement, durations, fabric, Collectives(fabric)).run()
    layer = engine_class("layer_spans")(program, placement, durations, fabric,
                                        Collectives(fabric)).run()
    for mine, theirs in zip(layer.memory_events, reference.memory_events, strict=True):
        _same_memory(mine, theirs)
    assert max(s[5] for s in layer.spans) == pytest.approx(max(s[5] for s in reference.spans),
                                                           rel=1e-12)
    assert len(layer.spans) < len(reference.spans) / 2


def test_the_registry_composes_and_refuses_unknown_names():
    assert engine_class() is Engine
    assert engine_class("gangs", "batching") is engine_class("batching", "gangs")
    for name, plugin in PLUGINS.items():
        assert issubclass(engine_class(name), plugin)
    with pytest.raises(ValueError, match="unknown engine plug-in 'warp'"):
        engine_class("warp")


@pytest.mark.parametrize("parallelism", PIPELINES + [
    COMBINED, {**COMBINED, "schedule": "1f1b", "virtual_stages": 1, "moe_overlap": "dualpipe",
               "training__global_batch": 64},
    dict(pp=2, dp=8, zero=1), dict(pp=4, dp=4, schedule="gpipe"),
    dict(pp=2, dp=8, stage_layers=[3, 5]), dict(pp=2, dp=8, zero=3),
    dict(pp=2, dp=8, fsdp={"sharding": "full_shard"}), dict(tp=2, pp=2, dp=4, cp=1,
                                                             schedule="interleaved",
                                                             virtual_stages=2)], ids=str)
def test_stamped_steps_build_the_same_program(parallelism, monkeypatch):
    """The builder copies a step of a kind from its first instance (``stamping.Pattern``)
    where nothing but the ops and the stage's ready state change: the program is
    the one built step by step (combined steps of two micro-batches too), and it
    does copy steps."""
    import workloads.program as builder
    scenario = from_dict(tiny(**parallelism))
    copies, stamp = [], builder.stamping.Pattern.stamp  # (whether each copy spans two)
    monkeypatch.setattr(builder.stamping.Pattern, "stamp", lambda self, b, mb: copies.append(
        any(op[4] not in (None, 0) for op in self.ops)) or stamp(self, b, mb))
    stamped = build_program(scenario.model, scenario.training, scenario.parallel)
    assert bool(copies) == builder.stamping.stampable(builder.make_context(
        scenario.model, scenario.training, scenario.parallel))
    assert any(copies) == (scenario.parallel.moe_overlap != "none")
    monkeypatch.setattr(builder, "STAMP", False)
    built = build_program(scenario.model, scenario.training, scenario.parallel)
    assert (stamped.ops, stamped.steps, stamped.groups) == (built.ops, built.steps, built.groups)


def test_driven_streams_hand_back_what_they_do_not_handle():
    """Gangs whose pipeline peers are not one gang (half a stage sends to a whole
    one): the driven pipeline stream hands its messages back to a core process,
    and the timeline is still the reference's."""
    program, placement, fabric, durations = _setup(dict(tp=8, pp=2))
    represents = {0: (1, 2, 3), 4: (5, 6, 7), 8: tuple(range(9, 16))}
    nodes = pd.Series([fabric.node_of(g) for g in placement]).to_numpy()
    reference = Engine(program, placement, durations, fabric, Collectives(fabric)).run()
    fast = engine_class("batching", "gangs", "exclusive_links", "passes", "pipeline_streams")(
        program, placement, durations, fabric, Collectives(fabric), represents=represents,
        exclusive=exclusive_dimensions(program, fabric, placement)[0]).run()
    a, b = _spans(reference, nodes), _spans(fast, nodes)
    assert len(a) == len(b) and (a["name"] == b["name"]).all()
    assert b["end"].to_numpy() == pytest.approx(a["end"].to_numpy(), rel=1e-9)
    assert len(fast.collectives) == len(reference.collectives)


def test_the_plans_are_the_rules_and_the_choice_builds_no_other():
    """``valid_plans`` holds the 13 plans the method choice can build (the reference,
    compute planning alone, folding, gangs with call groups and exclusive links,
    replayed steps with driven streams) and nothing the rules refuse; a Method
    with another set of plug-ins is an internal error."""
    from simulator.engine.records import SimulationError
    from simulator.runner.symmetry import Method

    plans = valid_plans()
    assert len(plans) == 13 and len(set(map(frozenset, plans))) == 13
    assert ("batching", "gangs") not in plans and valid(("batching", "gangs", "call_groups"))
    assert not valid(("batching", "folding", "gangs", "call_groups"))
    assert not valid(("gangs", "call_groups", "exclusive_links", "passes", "batching"))
    with pytest.raises(SimulationError, match="not a valid plan"):
        Method(("batching", "gangs"))
