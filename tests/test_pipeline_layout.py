"""Megatron's pipeline layouts as written (issue 56, item 6):
``parallelism.pipeline_layout`` (Megatron-Core's ``pipeline_model_parallel_layout``,
``megatron/core/transformer/pipeline_parallel_layer_layout.py``), the
``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``
split, and a stage's layers over its virtual chunks."""

import copy
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator import run
from simulator.cli import main
from simulator.config.scenario import ScenarioError, from_dict
from tests.test_hardening import FUZZ, one_error
from workloads.pipeline_layout import LayoutSyntaxError, parse
from workloads.program import make_context

TINY = {
    "name": "layout",
    "seed": 0,
    "cluster": {"preset": "dgx-a100", "nodes": 1, "compute_jitter": 0.0},
    "model": {"layers": 8, "hidden": 512, "heads": 8, "vocab": 4096},
    "training": {"seq_len": 512, "global_batch": 16, "micro_batch": 1},
    "parallelism": {"pp": 2, "dp": 4},
}


def tiny(model=None, **parallelism) -> dict:
    scenario = copy.deepcopy(TINY)
    scenario["parallelism"].update(parallelism)
    scenario["model"].update(model or {})
    return scenario


def interleaved(**keys) -> dict:
    return tiny(schedule="interleaved", virtual_stages=2, **keys)


def chunks_of(scenario: dict) -> list[range]:
    """The layers of each virtual stage the program is built with."""
    s = from_dict(scenario)
    return make_context(s.model, s.training, s.parallel).chunks


# -- the parser, against Megatron-Core's own examples -------------------------------

@pytest.mark.parametrize(("text", "pieces"), [
    # parse_str_to_list's docstring: [["E","t","t","t"]] + [["t","t"]] * 29 + [["m"], ["L"]]
    ("Ettt|(tt|)*29,m|L", ("Ettt", *["tt"] * 29, "m", "L")),
    # the issue's (and Megatron's docs' DeepSeek-V3 on PP16 VPP2 with the MTP standalone)
    ("Et*3|(t*4|)*14ttL", ("Ettt", *["tttt"] * 14, "ttL")),
    ("Et*3|(tt|)*29,m|L", ("Ettt", *["tt"] * 29, "m", "L")),
    # TransformerConfig's docstring: 'E|(tt|)*2,(t|)*4,mL'
    ("E|(tt|)*2,(t|)*4,mL", ("E", "tt", "tt", "t", "t", "t", "t", "mL")),
    # the unrolling examples beside Megatron's patterns: (|ab)*2,cd -> |ab|abcd
    ("(|tt)*2,tL", ("", "tt", "tttL")),
    ("Et(t|)*2", ("Ett", "t", "")),
    ("Et*0|tL", ("E", "tL")),
])
def test_the_parser_reads_megatrons_examples(text, pieces):
    assert parse(text) == pieces


@pytest.mark.parametrize(("text", "why"), [
    ("E(t*4|t*4L", "unclosed '('"),
    ("Et*4)|t*4L", "')' without its '('"),
    ("E((tt)*2)*2L", "nests parentheses"),
    ("E(tt)L", "without its '*N'"),
    ("E()*2L", "empty group"),
    ("Et*|tL", "'*' without a count"),
    ("*2Et|tL", "'*' that follows no symbol"),
    ("Et*2*3|L", "'*' that follows no symbol"),
    ("Et x|tL", "' ' is not a symbol"),
    ("Et*4|x*4L", "'x' is not a symbol"),
    ("Et*99999999999|L", "more than"),
    ("", "is empty"),
])
def test_the_parser_refuses_bad_strings(text, why):
    with pytest.raises(LayoutSyntaxError, match=re.escape(why)):
        parse(text)


@FUZZ
@given(st.text(alphabet="EtmL|()*,0123 x", max_size=24))
def test_the_parser_parses_or_refuses_with_its_own_error(text):
    try:
        pieces = parse(text)
    except LayoutSyntaxError:
        return
    assert all(set(piece) <= set("EtmL") for piece in pieces)


# -- bad layouts: one line naming the key, the value and what is wrong --------------

@pytest.mark.parametrize(("keys", "message"), [
    (dict(pipeline_layout="Et*4|t*2|t*2L"), r"has 3 pieces; parallelism.pp x virtual_stages "
                                            r"= 2 x 1 = 2 needs 2"),
    (dict(pipeline_layout="Et*3|t*4L"), r"has 7 transformer layers \(t\); model.layers is 8"),
    (dict(pipeline_layout="t*4|Et*4L"), "the embedding .E. must begin the first piece"),
    (dict(pipeline_layout="Et*4|t*4LE"), "the embedding .E. must be given once"),
    (dict(pipeline_layout="Et*4|Lt*4"), "the loss .L. must end the last piece"),
    (dict(pipeline_layout="Et*4L|t*4L"), "the loss .L. must be given once"),
    (dict(pipeline_layout="Et*4|t*4mL"), r"has 1 MTP layers \(m\); model.mtp_layers is 0"),
    (dict(pipeline_layout="E(t*4|t*4L"), "has an unclosed '\\('"),
    (dict(pipeline_layout=7), "must be a string"),
    (dict(pipeline_layout="Et*4|t*4L", stage_layers=[4, 4]),
     "cannot be combined with parallelism.stage_layers"),
    (dict(pipeline_layout="Et*4|t*4L", account_for_loss_in_pipeline_split=True),
     "cannot be combined with parallelism.account_for_loss_in_pipeline_split"),
    (dict(account_for_embedding_in_pipeline_split=True),
     r"model.layers \(8\) \+ 1 \(the embedding\) = 9 must be divisible by parallelism.pp "
     r"\(2\)"),
    (dict(account_for_embedding_in_pipeline_split=True, stage_layers=[4, 4]),
     "cannot be combined with parallelism.stage_layers"),
])
def test_bad_layouts_name_the_key(keys, message):
    with pytest.raises(ScenarioError, match=f"^parallelism.(pipeline_layout|account_for|"
                                            f"stage_layers).*{message}"):
        from_dict(tiny(**keys))


def test_mtp_layers_go_with_the_loss_on_the_last_stage():
    mtp = {"mtp_layers": 1}
    assert chunks_of(tiny(mtp, pipeline_layout="Et*4|t*4mL")) == [range(0, 4), range(4, 8)]
    for layout, message in (("Et*4|t*4L", r"has 0 MTP layers \(m\); model.mtp_layers is 1"),
                            ("Et*4m|t*4L", "MTP layers .m. must stand in the last piece"),
                            ("Et*4|t*3mtL", "MTP layers .m. must follow every transformer")):
        with pytest.raises(ScenarioError, match=f"^parallelism.pipeline_layout: .*{message}"):
            from_dict(tiny(mtp, pipeline_layout=layout))


def test_a_bad_layout_is_one_line_on_the_command_line(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    import yaml
    path.write_text(yaml.safe_dump(tiny(pipeline_layout="Et*3|t*4L")))
    err = one_error(capsys, main(["run", str(path), "--out", str(tmp_path / "o")]))
    assert err.startswith("error: parallelism.pipeline_layout: 'Et*3|t*4L' has 7")


# -- which layers each chunk holds ---------------------------------------------------

def test_a_stages_layers_fill_its_chunks_in_order():
    """13 layers on a stage of 4 chunks: [4, 4, 4, 1], not [4, 3, 3, 3]. Megatron-Core
    itself refuses a stage whose layers its virtual stages do not divide
    (transformer_config.py: "number of layers at first stage ... must be divisible by
    virtual pipeline parallel degree"); the layout states such a split, and the issue
    gives Megatron's as [4, 4, 4, 1]: each chunk holds ceil(13 / 4) until the rest."""
    chunks = chunks_of(tiny(model={"layers": 17}, schedule="interleaved", virtual_stages=4,
                            stage_layers=[13, 4]))
    stage0 = [len(chunks[k]) for k in range(0, 8, 2)]
    stage1 = [len(chunks[k]) for k in range(1, 8, 2)]
    assert stage0 == [4, 4, 4, 1] and stage1 == [1, 1, 1, 1]
    assert [r.start for r in chunks] == [0, 4, 5, 9, 10, 14, 15, 16]


def test_the_layout_decides_each_chunks_layers():
    chunks = chunks_of(interleaved(pipeline_layout="Et|ttt|ttt|tL"))
    assert chunks == [range(0, 1), range(1, 4), range(4, 7), range(7, 8)]
    assert chunks_of(interleaved(pipeline_layout="E|t*4||t*4L")) == [
        range(0, 0), range(0, 4), range(4, 4), range(4, 8)]


def test_embedding_and_loss_counted_as_layers_in_the_split():
    """Megatron-Core's get_num_layers_to_build: (layers + E + L) / pp per stage, over
    its vpp chunks, one fewer in the first chunk (embedding) and the last (loss)."""
    both = dict(account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True)
    assert chunks_of(tiny(model={"layers": 6}, **both)) == [range(0, 3), range(3, 6)]
    assert chunks_of(tiny(model={"layers": 7}, account_for_embedding_in_pipeline_split=True)
                     ) == [range(0, 3), range(3, 7)]
    assert chunks_of(tiny(model={"layers": 7}, account_for_loss_in_pipeline_split=True)
                     ) == [range(0, 4), range(4, 7)]
    assert chunks_of(interleaved(model={"layers": 6}, **both)) == [
        range(0, 1), range(1, 3), range(3, 5), range(5, 6)]
    assert chunks_of(interleaved(model={"layers": 2}, **both)) == [
        range(0, 0), range(0, 1), range(1, 2), range(2, 2)]


# -- end to end ----------------------------------------------------------------------

MEASURED = {"wall_s", "events", "network_recomputes", "calls_alone", "steps_replayed",
            "pipeline_steps"}


def _summary(scenario: dict) -> dict:
    return {k: v for k, v in run(scenario).summary.items() if k not in MEASURED}


@pytest.mark.parametrize(("plain", "layout"), [
    (tiny(), "Et*4|t*4L"),
    (interleaved(), "Et*2|t*2|t*2|t*2L"),
    (tiny(stage_layers=[3, 5]), "Et*3|t*5L"),
    (tiny({"mtp_layers": 1}), "Et*4|t*4mL"),
    (tiny({"layers": 7}, account_for_embedding_in_pipeline_split=True), "Et*3|t*4L"),
])
def test_a_layout_equal_to_the_default_split_gives_the_same_run(plain, layout):
    with_layout = copy.deepcopy(plain)
    for key in ("stage_layers", "account_for_embedding_in_pipeline_split"):
        with_layout["parallelism"].pop(key, None)
    with_layout["parallelism"]["pipeline_layout"] = layout
    assert _summary(with_layout) == _summary(plain)


def test_an_uneven_layout_moves_memory_and_time_to_the_larger_stage():
    front = run(tiny(pipeline_layout="Et*6|t*2L")).summary
    back = run(tiny(pipeline_layout="Et*2|t*6L")).summary
    assert front["activation_gib_by_stage"][0] > back["activation_gib_by_stage"][0]
    assert front["peak_memory_gib_by_stage"][0] > back["peak_memory_gib_by_stage"][0]
    assert front["peak_memory_gib_by_stage"][1] < back["peak_memory_gib_by_stage"][1]
    assert front["compute_s_by_stage"][0] > back["compute_s_by_stage"][0]
    assert front["compute_s_by_stage"][1] < back["compute_s_by_stage"][1]


def test_a_stage_of_the_embedding_alone_computes_little_and_holds_its_table():
    """Megatron's standalone embedding stage ("E|t*8L"): the first stage runs the
    embedding only and holds its parameters; the layers' work is all the last's."""
    s = run(tiny(pipeline_layout="E|t*8L")).summary
    assert s["compute_s_by_stage"][0] < 0.05 * s["compute_s_by_stage"][1]
    assert 0 < s["peak_memory_gib_by_stage"][0] < s["peak_memory_gib_by_stage"][1]


@pytest.mark.parametrize("layout", ["E|t*4|t*4|L", "Et*4||t*4|L", "Et*8|||L"])
def test_empty_chunks_run(layout):
    s = run(interleaved(pipeline_layout=layout)).summary
    assert s["iteration_time_s"] > 0 and 0 < s["mfu"] < 1


def test_empty_chunks_from_the_split_run():
    both = dict(account_for_embedding_in_pipeline_split=True,
                account_for_loss_in_pipeline_split=True)
    s = run(interleaved(model={"layers": 2}, **both)).summary
    assert s["iteration_time_s"] > 0


def test_the_same_layout_gives_byte_identical_runs():
    scenario = interleaved(pipeline_layout="Et|ttt|ttt|tL")
    assert _summary(scenario) == _summary(copy.deepcopy(scenario))


@FUZZ
@given(st.text(alphabet="EtmL|()*,0123", max_size=20), st.sampled_from([1, 2]))
def test_any_layout_string_is_a_scenario_or_one_named_error(text, v):
    """Whatever the string, loading gives a scenario whose chunks hold every layer
    once, in order, or a ScenarioError naming the key (never another exception)."""
    keys = dict(schedule="interleaved", virtual_stages=v) if v > 1 else {}
    try:
        chunks = chunks_of(tiny(pipeline_layout=text, **keys))
    except ScenarioError as error:
        assert str(error).startswith("parallelism.pipeline_layout: "), error
        return
    assert len(chunks) == 2 * v and [n for r in chunks for n in r] == list(range(8))


def test_an_empty_chunk_runs_the_same_rank_by_rank():
    """The speed-ups the runner picks give the reference's run with an empty chunk."""
    scenario = interleaved(pipeline_layout="Et*4||t*4|L")
    full = {**copy.deepcopy(scenario), "simulation": {"symmetry": "full"}}
    assert run(scenario).summary["iteration_time_s"] == pytest.approx(
        run(full).summary["iteration_time_s"], rel=1e-12)


@pytest.mark.parametrize("moe", [False, True])
def test_an_empty_last_chunk_reduces_its_mtp_depths_gradients(moe):
    """The MTP depth runs after the head in the last chunk; with that chunk empty
    (``...|mL``, Megatron-Bridge's DeepSeek-V3 layout) its transformer layer's
    gradients are the last chunk's to reduce, not the last layer's chunk's (the
    build used to stop: ``gradients never reduced``)."""
    model = {"mtp_layers": 1}
    extra = {}
    if moe:
        model.update(experts=8, top_k=2, expert_ffn_hidden=256)
        extra = {"ep": 4, "moe_overlap": "1f1b", "overlap_grad_reduce": False}
    s = run(interleaved(model=model, pipeline_layout="Et*3|t*3|tt|mL", **extra)).summary
    assert s["iteration_time_s"] > 0 and 0 < s["mfu"] < 1
