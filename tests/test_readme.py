"""The README's two commands are the ones CI runs; the README stays short and
its links resolve (issue 43)."""

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


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert text.count("\n") <= 300
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target


def test_the_site_lists_every_page_and_builds_from_existing_files():
    """mkdocs.yml's nav names pages that exist (CI builds the site strictly)."""
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(nav):
        for item in nav:
            for value in item.values():
                yield from pages(value) if isinstance(value, list) else [value]
    generated = {"index.md", "benchmarks.md"}  # (docs/hooks.py copies them)
    for page in pages(config["nav"]):
        assert page in generated or (ROOT / "docs" / page).exists(), page
