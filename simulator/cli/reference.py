"""The documentation's reference pages, generated from the code, never written
twice: every scenario key (from the specs each section is read by: what it
accepts from its setting's check, its default, its description from the
comment beside its field: ``base.field_docs``), every command and option
(from the parsers), every preset (from the registries, as ``clustersim
presets`` lists them), every summary key (``analysis.summary_keys``).
``docs/hooks.py`` writes them when the site is built; ``tests/test_reference.py``
fails on a key, option, preset or summary key without a description.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import re
from collections.abc import Callable
from pathlib import Path

from simulator.base.field_docs import descriptions
from simulator.base.fields import allowed_by
from simulator.cli.completion import subcommands as commands  # each command's parser


def sections() -> list[tuple[str, str, list[tuple[type, bool]]]]:
    """(key path, what the section is, [(spec, whether its defaults are a
    preset's)]) of every part of a scenario, in the order a scenario writes them."""
    from simulator.config.cluster import ClusterSection, FabricSection, Machine
    from simulator.config.jobs import JobHead
    from simulator.config.model import ModelSection
    from simulator.config.network import NetworkSettings
    from simulator.config.scenario import ScenarioHead
    from simulator.config.simulation import SimulationSpec
    from simulator.config.workload import WorkloadSpec
    from topologies import ClusterSpec
    from topologies.networks import NETWORKS
    from workloads.background import BackgroundSpec
    from workloads.models import ModelSpec
    from workloads.training import DeepSpeedSpec, FsdpSpec, ParallelSpec, TrainingSpec

    return [
        ("", "the scenario's own keys", [(ScenarioHead, False)]),
        ("cluster", "the system: a preset, the keys of it a scenario overrides (their default "
         "is the preset's), and the run-time ones",
         [(ClusterSection, False), (ClusterSpec, True), (Machine, False)]),
        ("cluster.fabric", "the inter-node network (each kind's own settings below)",
         [(FabricSection, False)]),
        *((f"cluster.fabric (type: {name})", " ".join((kind.__doc__ or "").split()),
           [(kind, False)]) for name, kind in NETWORKS.items()),
        ("model", "the model: a preset, a Hugging Face config, or every key inline (the "
         "keys a scenario gives override the preset's or the config's)",
         [(ModelSection, False), (ModelSpec, True)]),
        ("training", "the batch, sequence, precision and recompute", [(TrainingSpec, False)]),
        ("parallelism", "how the model is split over the GPUs", [(ParallelSpec, False)]),
        ("parallelism.fsdp", "PyTorch FSDP's options", [(FsdpSpec, False)]),
        ("parallelism.deepspeed", "DeepSpeed's options", [(DeepSpeedSpec, False)]),
        ("network", "how NCCL lowers collectives", [(NetworkSettings, False)]),
        ("simulation", "how the run is simulated, never what", [(SimulationSpec, False)]),
        ("jobs.NAME", "several jobs on the cluster: each a training job (with its own model, "
         "training and parallelism sections, as above, or a workload section, as below) or "
         "background traffic",
         [(JobHead, False)]),
        ("jobs.NAME (kind: background)", "background traffic", [(BackgroundSpec, False)]),
        ("workload", "a program read from Chakra execution traces (clustersim export-chakra), "
         "instead of the model, training and parallelism sections", [(WorkloadSpec, False)]),
    ]


def keys(spec: type, preset: bool) -> list[tuple[str, str, str, str]]:
    """(key, what it accepts, default, description) of each setting of ``spec``."""
    said = descriptions(spec)
    rows = []
    for f in dataclasses.fields(spec):
        if "check" not in f.metadata:
            continue
        rows.append((f.name, allowed_by(f.metadata["check"]), _default(f, preset),
                     said[f.name]))
    return rows


def _default(f: dataclasses.Field, preset: bool) -> str:
    if preset:
        return "the preset's"
    if f.metadata.get("required"):
        return "required"
    if f.default is dataclasses.MISSING:
        return "the preset's" if f.default_factory is dataclasses.MISSING else "a section"
    value = f.default.value if isinstance(f.default, enum.Enum) else f.default
    return "none" if value in (None, ()) else str(value).lower() if isinstance(value, bool) \
        else f"{value:g}" if isinstance(value, float) else str(value)


def scenario_page() -> str:
    """The scenario format's reference: a table per section."""
    out = ["# Scenario keys", "",
           "Every key a scenario file may give, generated from the specs that read each "
           "section (the same checks give the one-line errors). Sizes, bandwidths and times "
           "take units (`\"25 MB\"`, `\"400 Gb/s\"`, `\"1 us\"`); `--set KEY.PATH=VALUE` "
           "overrides any of them from the command line.", ""]
    for path, what, specs in sections():
        what = what[:1].upper() + what[1:].rstrip(".") + "."
        out += [f"## `{path}`" if path else "## Top level", "", what, "",
                "| key | accepts | default | description |", "|---|---|---|---|"]
        for spec, preset in specs:
            out += [f"| `{key}` | {_cell(accepts)} | {_cell(default)} | {_cell(text)} |"
                    for key, accepts, default, text in keys(spec, preset)]
        out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def options(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(flags or name, default, help) of each argument of ``parser`` but ``--help``."""
    out = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        flags = ", ".join(action.option_strings) or action.dest
        default = "" if action.default in (None, False, argparse.SUPPRESS, []) else \
            str(action.default)
        choices = f" ({', '.join(map(str, action.choices))})" if action.choices else ""
        out.append((flags, default, (action.help or "") + choices))
    return out


def cli_page(parser: argparse.ArgumentParser) -> str:
    """The command line's reference: each command's usage, description and options."""
    out = ["# Command line", "", "Generated from the parsers of `clustersim` (the same text "
           "as `clustersim COMMAND --help`).", "", "```", parser.format_usage().strip(),
           "```", ""]
    for name, (sub, what) in commands(parser).items():
        out += [f"## `clustersim {name}`", "", what.strip(), "", "```",
                sub.format_usage().strip(), "```", "", "| argument | default | meaning |",
                "|---|---|---|"]
        out += [f"| `{flags}` | {_cell(default)} | {_cell(text)} |"
                for flags, default, text in options(sub)]
        out.append("")
    return "\n".join(out)


def presets_page() -> str:
    """Every preset, as ``clustersim presets`` lists them."""
    from simulator.cli import presets
    from topologies import CLUSTERS

    out = ["# Presets", "", "Generated from the registries (`clustersim presets` prints the "
           "same).", "", "## Clusters (`cluster.preset`)", "", "| preset | system | figures |",
           "|---|---|---|"]
    out += [f"| `{name}` | {_cell(CLUSTERS[name].description)} | {_cell(text)} |"
            for name, text in presets.clusters()]
    for title, rows in (("GPUs (`cluster.gpu`)", presets.gpus()),
                        ("Models (`model.preset`)", presets.models())):
        out += ["", f"## {title}", "", "| preset | figures |", "|---|---|"]
        out += [f"| `{name}` | {_cell(text.strip())} |" for name, text in rows]
    return "\n".join(out) + "\n"


def summary_page() -> str:
    """Every summary key (``analysis.summary_keys``)."""
    from simulator.analysis.summary_keys import ROWS

    out = ["# Summary keys", "", "What a run's `summary.json` holds (generated from "
           "`simulator/analysis/summary_keys.py`; `clustersim run --json` prints it).", "",
           "| key | definition |", "|---|---|"]
    return "\n".join(out + [f"| {keys} | {_cell(text)} |" for keys, text in ROWS]) + "\n"


VALIDATE = re.compile(r"<!-- validate (?P<args>[^>]*?) -->\n(?P<body>.*?)\n<!-- /validate -->",
                      re.S)  # a table of the accuracy page: clustersim validate ARGS --markdown


def accuracy_blocks(text: str) -> list[tuple[str, str]]:
    """(the ``clustersim validate`` arguments, the table) of each generated block
    of the accuracy page.

    >>> accuracy_blocks("x\\n<!-- validate --tag kernels -->\\n| a |\\n<!-- /validate -->\\n")
    [('--tag kernels', '| a |')]
    """
    return [(m["args"], m["body"].strip()) for m in VALIDATE.finditer(text)]


def refresh_accuracy(path: str | Path, validate: Callable[[list[str]], str]) -> int:
    """Replace each block of the accuracy page at ``path`` by what ``validate(args)``
    (``clustersim validate ARGS --markdown``'s output) prints now; how many changed."""
    path = Path(path)
    text, changed = path.read_text(), 0

    def fresh(match: re.Match) -> str:
        nonlocal changed
        table = validate([*match["args"].split(), "--markdown"]).strip()
        changed += table != match["body"].strip()
        return f"<!-- validate {match['args']} -->\n\n{table}\n\n<!-- /validate -->"
    path.write_text(VALIDATE.sub(fresh, text))
    return changed


def write(folder: str | Path) -> list[Path]:
    """Write the reference pages into ``folder``; the paths written."""
    from simulator.cli import _parser

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pages = {"scenario.md": scenario_page(), "cli.md": cli_page(_parser()),
             "presets.md": presets_page(), "summary.md": summary_page()}
    for name, text in pages.items():
        (folder / name).write_text(text)
    return [folder / name for name in pages]
