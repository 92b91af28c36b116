"""``clustersim completion bash|zsh|fish``: a shell completion script for the
commands and their options, generated from the command line's own parsers
(so it never lists an option the parser lacks).

    eval "$(clustersim completion bash)"     # in ~/.bashrc
    eval "$(clustersim completion zsh)"      # in ~/.zshrc (through bashcompinit)
    clustersim completion fish > ~/.config/fish/completions/clustersim.fish
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish")


def add_parser(sub) -> None:
    completion = sub.add_parser(
        "completion", help="print a shell completion script (bash, zsh or fish)",
        description="Print a completion script for the commands and their options: "
                    "eval \"$(clustersim completion bash)\" in ~/.bashrc (zsh: the same "
                    "with zsh), or clustersim completion fish > "
                    "~/.config/fish/completions/clustersim.fish.")
    completion.add_argument("shell", choices=SHELLS, help="the shell")


def commands(parser: argparse.ArgumentParser) -> dict[str, dict[str, list[str]]]:
    """{command: {option: its choices (none: a value or a flag)}} of ``parser``'s
    subcommands, the top level's own options under ``""``."""
    return {"": _options(parser),
            **{name: _options(sub) for name, (sub, _) in subcommands(parser).items()}}


def subcommands(parser: argparse.ArgumentParser
                ) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Each command's (parser, what it does), in ``clustersim --help``'s order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            said = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (sub, sub.description or said.get(name, ""))
                    for name, sub in action.choices.items()}
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """{option: the values to offer}: its ``choices``, or the ``completions`` an
    option sets that takes more spellings than it lists (``collective --op``)."""
    return {flag: [str(c) for c in getattr(action, "completions", None) or action.choices or ()]
            for action in parser._actions for flag in action.option_strings}


def bash(spec: dict[str, dict[str, list[str]]]) -> str:
    """The bash script (zsh runs it through ``bashcompinit``)."""
    names = " ".join(n for n in spec if n)
    top = " ".join(spec[""])
    cases = []
    for name, flags in spec.items():
        if name:
            cases.append(f'        {name}) opts="{" ".join(flags)}";;')
    values = [f'        {name}:{flag}) COMPREPLY=( $(compgen -W "{" ".join(choices)}" -- "$cur") );'
              " return;;"
              for name, flags in spec.items() if name for flag, choices in flags.items()
              if choices]
    return "\n".join([
        "# clustersim completion (bash): eval \"$(clustersim completion bash)\"",
        "_clustersim() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local cmd="${COMP_WORDS[1]}" opts=""',
        "    if [[ $COMP_CWORD -eq 1 ]]; then",
        f'        COMPREPLY=( $(compgen -W "{names} {top}" -- "$cur") ); return',
        "    fi",
        '    case "$cmd:$prev" in', *values, "    esac",
        '    case "$cmd" in', *cases, "    esac",
        '    if [[ "$cur" == -* ]]; then',
        '        COMPREPLY=( $(compgen -W "$opts" -- "$cur") )',
        "    else",
        '        COMPREPLY=( $(compgen -f -- "$cur") )',
        "    fi",
        "}",
        "complete -o filenames -F _clustersim clustersim", ""])


def zsh(spec: dict[str, dict[str, list[str]]]) -> str:
    return ("# clustersim completion (zsh): eval \"$(clustersim completion zsh)\"\n"
            "autoload -U +X bashcompinit && bashcompinit\n" + bash(spec))


def fish(spec: dict[str, dict[str, list[str]]]) -> str:
    names = " ".join(n for n in spec if n)
    lines = ["# clustersim completion (fish): clustersim completion fish > "
             "~/.config/fish/completions/clustersim.fish",
             f'complete -c clustersim -n "__fish_use_subcommand" -f -a "{names}"']
    for name, flags in spec.items():
        when = f"__fish_seen_subcommand_from {name}" if name else "__fish_use_subcommand"
        for flag, choices in flags.items():
            option = f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}"
            values = f' -x -a "{" ".join(choices)}"' if choices else ""
            lines.append(f'complete -c clustersim -n "{when}" {option}{values}')
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    spec = commands(args.parser)
    print({"bash": bash, "zsh": zsh, "fish": fish}[args.shell](spec), end="")
    return 0
