"""The ``clustersim`` command line.

    clustersim run SCENARIO.yaml [MORE.yaml ...] --out DIR [--format png|pdf|svg] [--json]
                   [--set k=v ...]   (several: each into DIR/NAME, one table compares them)
    clustersim init [FILE] [--cluster P --nodes N --model P --tp --pp --cp --ep ...] [--force]
    clustersim collective --cluster dgx-a100 --nodes 2 --op all_reduce --min-bytes 1M \
        --max-bytes 8G [--factor 2] [--group 0-7] [--algorithm A] [--protocol P] [--csv FILE]
    clustersim gantt RUN_DIR [--out FILE] [--ranks 0-7,64] [--from T] [--to T] [--streams]
    clustersim comms RUN_DIR [--csv FILE] [--plot FILE]
    clustersim compare RUN_A RUN_B [--out FILE]
    clustersim trace RUN_DIR [--ranks 0-7,64] [--out FILE]
    clustersim blame RUN_DIR [--out FILE] [--top N]
    clustersim sweep BASE.yaml --grid KEY=V1,V2 [--zip KEY=V1,V2 ...] --out DIR
                     [--workers N] [--dask tcp://HOST:8786] [--retry-failed]
    clustersim sweep SWEEP.yaml --out DIR ...   (a file with base, grid, zip)
    clustersim plot DIR --x KEY --y METRIC [--hue KEY | --z METRIC] [--out FILE]
    clustersim search SCENARIO.yaml [--space FILE] [--tp 1,2 --pp ... --ep ...] [--top N]
                      [--out DIR] [--workers N] [--dask ADDRESS] [--compare] [--show N]
    clustersim validate [--case NAME ...] [--tag TAG ...] [--csv FILE] [--markdown] [--list]
    clustersim calibrate KERNELS.csv --gpu NAME --out FILE [--precision bf16]
    clustersim presets
    clustersim export-chakra RUN_DIR|SCENARIO.yaml --out DIR   (workload: {chakra: DIR} reads it)
    clustersim completion bash|zsh|fish
    clustersim --version

Exit codes: 0 success; 1 the simulation or its outputs failed (a deadlock the
scenario implies, a failed sweep case, a disk full or a file too large while
writing, memory exhausted); 2 bad input (one line on stderr); 3 internal error
(a bug: one line on stderr, the traceback saved to a file); 130 interrupted
(Ctrl-C), 143 terminated (SIGTERM): partial outputs removed.

One module per command (``run``, ``init``, ``collective``, ``gantt``, ``comms``,
``compare``, ``trace``, ``blame``, ``sweep``, ``plot``, ``validate``,
``calibrate``, ``presets``, ``search``, ``export_chakra``, ``completion``),
registered in
``COMMANDS`` below; ``failures`` says what a failed command exits with and
prints; ``options`` checks and
makes every output path before a command works; ``reference`` writes the
documentation's reference pages from the parsers, specs and registries.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from simulator.cli import (
    blame,
    calibrate,
    collective,
    comms,
    compare,
    completion,
    export_chakra,
    failures,
    gantt,
    init,
    plot,
    presets,
    run,
    search,
    sweep,
    trace,
    validate,
)

# One module per command (``add_parser`` and ``run``); adding a command = one module
# + one line here. The order is the order of ``clustersim --help``.
COMMANDS = {"run": run, "init": init, "presets": presets, "collective": collective,
            "gantt": gantt, "comms": comms, "compare": compare, "trace": trace, "blame": blame,
            "sweep": sweep, "search": search, "plot": plot, "validate": validate,
            "calibrate": calibrate, "export-chakra": export_chakra, "completion": completion}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clustersim", description="Simulate distributed transformer training.")
    parser.add_argument("--version", action="version", version=f"clustersim {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS.values():
        command.add_parser(sub)
    parser.set_defaults(parser=parser)  # (``completion`` reads the commands off it)
    return parser


def _version() -> str:
    """The installed package's version (the source tree's pyproject.toml otherwise)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("clustersim")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


class Terminated(BaseException):
    """SIGTERM (``kill PID``): unwound like Ctrl-C, so partial outputs are removed."""


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command].run(args)
    except BrokenPipeError:  # e.g. `clustersim presets | head`: the reader left
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0
    except KeyboardInterrupt:
        print("interrupted (partial outputs removed)", file=sys.stderr)
        return 130
    except Terminated:
        print("terminated (partial outputs removed)", file=sys.stderr)
        return 143
    except Exception as error:  # noqa: BLE001 - each kind its exit code and one line
        code, line = failures.failure(error, getattr(args, "crash_dir", None))
        print(line, file=sys.stderr)
        return code


def console() -> None:
    """The ``clustersim`` command: ``main``, then leave at once (a large run's
    millions of objects take a second to free one by one, for nothing: the
    process is ending; its files are closed and its output flushed first).
    SIGTERM unwinds like Ctrl-C (exit 143), so what it was writing is removed."""
    def terminate(_signum, _frame):
        raise Terminated()
    signal.signal(signal.SIGTERM, terminate)
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader left: nothing more to say
        pass
    os._exit(code)


if __name__ == "__main__":
    console()
