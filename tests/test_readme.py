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


def test_readme_accuracy_table_is_the_accuracy_scripts_output():
    import contextlib
    import io
    import runpy

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        runpy.run_path(str(ROOT / "scripts" / "accuracy.py"), run_name="__main__")
    table = buffer.getvalue().strip()
    assert table.count("\n") >= 10
    assert table in (ROOT / "README.md").read_text(), "re-run scripts/accuracy.py into README"


def test_calibrated_pieces_stay_close_to_measurements():
    import runpy

    accuracy = runpy.run_path(str(ROOT / "scripts" / "accuracy.py"))
    for case, _, error in accuracy["table"]():
        if case.basis == "fit":  # a parameter was set from this row: it must reproduce it
            assert abs(error) < 5, case.name
