"""The README's two commands are the ones CI runs."""

import re

from tests.conftest import ROOT


def readme_commands():
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- setup -->\s*```bash\n(.*?)```", text, re.S)
    assert block, "README needs a ```bash block after <!-- setup -->"
    return [line for line in block.group(1).splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readme_commands():
    ci = (ROOT / ".ci" / "run").read_text()
    commands = readme_commands()
    assert len(commands) == 2
    for command in commands:
        assert command in ci
