"""The command tables of README.md ("The commands") and docs/cli.md ("Commands") list
exactly the commands scripts/sandbox's parser has, and each day-2 command's help and options
are its operation's argument-spec entry point (roles/<role>/meta/argument_specs.yml)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from sandboxlib import cli, day2, specs

REPO = Path(__file__).resolve().parents[1]


def parser_commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in cli.build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def table_commands(doc: str, heading: str) -> set[str]:
    """The first word of every `code` span in the first column of the table under heading."""
    text = (REPO / doc).read_text()
    section = text[text.index(heading):]
    rows = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        if line.startswith("| `"):
            rows.append(line.split(" | ")[0])
    assert rows, f"no command table under {heading} in {doc}"
    return {span.split()[0] for row in rows for span in re.findall(r"`([^`]+)`", row)}


@pytest.mark.parametrize(("doc", "heading"), [("README.md", "## The commands"),
                                              ("docs/cli.md", "## Commands")])
def test_the_tables_list_exactly_the_parsers_commands(doc: str, heading: str) -> None:
    listed, parsed = table_commands(doc, heading), set(parser_commands())
    assert sorted(parsed - listed) == [], f"commands missing from {doc}'s table"
    assert sorted(listed - parsed) == [], f"{doc}'s table lists commands the CLI lacks"


@pytest.mark.parametrize("command", sorted(day2.COMMANDS))
def test_day2_help_and_options_come_from_the_entry_point(command: str) -> None:
    ref = day2.ENTRY_POINTS[command]
    parser = parser_commands()[command]
    assert parser.description == specs.summary(ref)
    actions = {a.dest: a for a in parser._actions}
    for variable, _flags, extra in day2.ARGUMENTS.get(command, []):
        spec = specs.option(ref, variable)
        assert actions[variable].help == " ".join(spec["description"].split()), variable
        if spec.get("type") == "bool":
            assert isinstance(actions[variable], argparse._StoreTrueAction), variable
        assert actions[variable].required == bool(spec.get("required")) or not _flags


def test_a_value_the_spec_refuses_is_refused_naming_the_input() -> None:
    with pytest.raises(cli.UsageError, match="etcd_upgrade_to: required"):
        specs.check("etcd/upgrade_check", {})
    with pytest.raises(cli.UsageError, match="etcd_defrag_compact: 'yes' is not a bool value"):
        specs.check("etcd/defrag", {"etcd_defrag_compact": "yes"})
    with pytest.raises(cli.UsageError, match="etcd_remove_members: 'a' is not a list value"):
        specs.check("etcd/remove_check", {"etcd_remove_members": "a"})
    with pytest.raises(cli.UsageError, match="etcd_upgrade: not an input of etcd/upgrade_check"):
        specs.check("etcd/upgrade_check", {"etcd_upgrade_to": "3.5.30", "etcd_upgrade": "x"})
    specs.check("etcd/remove_check", {"etcd_remove_members": ["etcd-4", "etcd-5"]})


def test_up_set_takes_main_variables_only() -> None:
    """A day-2 operation's input is its command's option, not a variable of `up`."""
    assert "etcd_health_timeout" in cli.role_variables()
    assert "etcd_upgrade_to" not in cli.role_variables()
