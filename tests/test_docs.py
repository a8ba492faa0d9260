"""The front door stays true: the README and the guides name every command and link only to files that exist."""

import argparse
import re

from opsynth.commands.cli import build_parser
from tests.test_layers import ROOT

DOCS = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands() -> list[str]:
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sorted(sub.choices)


def test_the_readme_and_the_command_guide_name_every_command():
    readme = (ROOT / "README.md").read_text()
    guide = (ROOT / "docs" / "commands.md").read_text()
    for command in commands():
        assert f"`opsynth {command}" in readme, command
        assert f"`opsynth {command}" in guide, command


def test_every_relative_link_of_the_docs_resolves():
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, which does not exist"
