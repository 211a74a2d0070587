"""The command tables of docs/cli.md ("Commands") and README.md ("The commands") list the
commands scripts/sandbox's parser has (docs/cli.md every one, README all but the day-2 ones it
may leave to docs/cli.md) and show each day-2 row's arguments and playbooks
(scripts/sandboxlib/day2.py's DAY2); each day-2 command's help and options are its
operation's argument-spec entry point (roles/<role>/meta/argument_specs.yml)."""

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


def table_rows(doc: str, heading: str) -> list[tuple[set[str], str]]:
    """Each row of the table under heading: the commands its first column names (the first
    word of each `code` span), and the whole row."""
    text = (REPO / doc).read_text()
    lines = text[text.index(heading):].splitlines()[1:]
    rows = []
    for line in lines[:next((i for i, x in enumerate(lines) if x.startswith("#")), len(lines))]:
        if line.startswith("| `"):
            rows.append(({s.split()[0] for s in re.findall(r"`([^`]+)`", line.split(" | ")[0])},
                         line))
    return rows


def table_commands(doc: str, heading: str) -> set[str]:
    """The first word of every `code` span in the first column of the table under heading."""
    rows = table_rows(doc, heading)
    assert rows, f"no command table under {heading} in {doc}"
    return {name for names, _ in rows for name in names}


def test_the_cli_docs_table_lists_exactly_the_parsers_commands() -> None:
    listed, parsed = table_commands("docs/cli.md", "## Commands"), set(parser_commands())
    assert sorted(parsed - listed) == [], "commands missing from docs/cli.md's table"
    assert sorted(listed - parsed) == [], "docs/cli.md's table lists commands the CLI lacks"


def test_the_readme_table_lists_every_command_but_may_leave_day2_ones_to_the_cli_docs() -> None:
    """README's table is the front door: every command but the day-2 ones (docs/cli.md lists
    those all; a new one needs a row there and may get one here), and none the CLI lacks."""
    listed, parsed = table_commands("README.md", "## The commands"), set(parser_commands())
    assert sorted(parsed - set(day2.COMMANDS) - listed) == [], "commands missing from README's table"
    assert sorted(listed - parsed) == [], "README's table lists commands the CLI lacks"


@pytest.mark.parametrize("command", sorted(day2.COMMANDS))
def test_the_tables_say_each_day2_rows_usage_and_playbooks(command: str) -> None:
    """From the row (day2.DAY2): docs/cli.md's first column shows each of its arguments
    (every flag, each positional's metavar), README's rows for it name its playbooks (its
    variants' too)."""
    row = day2.COMMANDS[command]
    usage = " ".join(line.split(" | ")[0] for names, line in table_rows("docs/cli.md", "## Commands")
                     if command in names)
    shown = [f for a in row.arguments for f in (a.flags[:1] or (a.metavar or a.variable,))]
    assert [f for f in shown if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", usage)] == [], \
        f"docs/cli.md's table does not show these arguments of {command}"
    readme = " ".join(line for names, line in table_rows("README.md", "## The commands")
                      if command in names)
    playbooks = [r.playbook for r in (row, *row.variants)]
    assert not readme or [p for p in playbooks if f"`{p}`" not in readme] == [], \
        f"README's table does not name these playbooks of {command}"


@pytest.mark.parametrize("command", sorted(day2.COMMANDS))
def test_day2_help_and_options_come_from_the_entry_point(command: str) -> None:
    row = day2.COMMANDS[command]
    parser = parser_commands()[command]
    assert parser.description == specs.summary(row.entry)
    actions = {a.dest: a for a in parser._actions}
    assert [a.variable for a in row.arguments] == [
        a.dest for a in parser._actions
            if a.dest not in ("help", "topology", "backend", "cluster", "verbose")]
    for arg in row.arguments:
        if arg.plain:   # a confirmation no spec declares: its help is the row's
            assert actions[arg.variable].help == arg.help, arg.variable
            continue
        spec = specs.option(arg.entry or row.entry, arg.variable)
        assert actions[arg.variable].help == (arg.help or " ".join(spec["description"].split())), \
            arg.variable
        if spec.get("type") == "bool":
            assert isinstance(actions[arg.variable], argparse._StoreTrueAction), arg.variable
        assert actions[arg.variable].required == bool(spec.get("required")) or \
            not arg.flags or arg.required is False


def test_a_tenant_variant_is_a_row_selected_by_its_option() -> None:
    """backup, restore and reset --tenant: a row of the command's, whose selector is the
    command's --tenant option and whose cluster-wide-only flags are the command's."""
    for row in day2.DAY2:
        flags = {f: a.variable for a in row.arguments for f in a.flags}
        for variant in row.variants:
            assert variant.name == row.name
            assert flags["--tenant"] == variant.selector, row.name
            assert set(variant.alone) <= set(flags), row.name
    assert sorted(r.name for r in day2.DAY2 if r.variants) == ["backup", "reset", "restore"]


def test_a_value_the_spec_refuses_is_refused_naming_the_input() -> None:
    with pytest.raises(cli.UsageError, match="etcd_upgrade_to: required"):
        specs.check("etcd/upgrade/check", {})
    with pytest.raises(cli.UsageError, match="etcd_defrag_compact: 'yes' is not a bool value"):
        specs.check("etcd/defrag/cluster", {"etcd_defrag_compact": "yes"})
    with pytest.raises(cli.UsageError, match="etcd_remove_members: 'a' is not a list value"):
        specs.check("etcd/members/remove_check", {"etcd_remove_members": "a"})
    with pytest.raises(cli.UsageError, match="etcd_upgrade: not an input of etcd/upgrade/check"):
        specs.check("etcd/upgrade/check", {"etcd_upgrade_to": "3.5.30", "etcd_upgrade": "x"})
    specs.check("etcd/members/remove_check", {"etcd_remove_members": ["etcd-4", "etcd-5"]})


def test_up_set_takes_main_variables_only() -> None:
    """A day-2 operation's input is its command's option, not a variable of `up`."""
    assert "etcd_health_timeout" in cli.role_variables()
    assert "etcd_upgrade_to" not in cli.role_variables()
