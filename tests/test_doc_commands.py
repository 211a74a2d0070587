"""tests/doc_commands.py: which lines of the documents the end-to-end tests run as typed,
and a check of those lines that needs no sandbox (every `scripts/sandbox` subcommand and
option they use exists)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from doc_commands import (
    Command,
    DocError,
    collect,
    commands,
    in_order,
    next_lines,
    with_topology,
)
from sandboxlib.cli import build_parser, split_passthrough
from sandboxlib.report import next_commands
from sandboxlib.topology import load

DOC = """# Title

<!-- doc-test: skip "scripts/test" the suite itself -->
```sh
scripts/sandbox up        # comment
# a comment line
scripts/test

scripts/sandbox kubectl get crd
```

```yaml
not: a command
```

<!-- doc-test: fails "scripts/sandbox kubectl --tenant x" exit 2 -->
<!-- doc-test: sandbox no-tls -->
```bash
ansible-playbook -i inventories/no-tls.yml playbooks/site.yml \\
  -e a=b
```

```sh
scripts/sandbox kubectl --tenant x get crd
scripts/sandbox down
```
"""


def test_commands_markers_and_continuations() -> None:
    got = commands(DOC, "DOC.md")
    assert [(c.source, c.line, c.sandbox, c.skip, c.exit_code) for c in got] == [
        ("DOC.md:5", "scripts/sandbox up        # comment", "", "", 0),
        ("DOC.md:7", "scripts/test", "", "the suite itself", 0),
        ("DOC.md:9", "scripts/sandbox kubectl get crd", "", "", 0),
        ("DOC.md:19", "ansible-playbook -i inventories/no-tls.yml playbooks/site.yml -e a=b",
         "no-tls", "", 0),
        ("DOC.md:24", "scripts/sandbox kubectl --tenant x get crd", "", "", 2),
        ("DOC.md:25", "scripts/sandbox down", "", "", 0),
    ]


@pytest.mark.parametrize(("marker", "error"), [
    ('<!-- doc-test: skip "nothing matches" reason -->', "match no command"),
    ("<!-- doc-test: skip scripts/sandbox up -->", 'takes "PREFIX"'),
    ('<!-- doc-test: fails "scripts/sandbox up" with 2 -->', 'takes "exit N"'),
    ("<!-- doc-test: sandbox two words -->", "one topology name"),
])
def test_bad_markers_are_refused(marker: str, error: str) -> None:
    with pytest.raises(DocError, match=error):
        commands(f"{marker}\n```sh\nscripts/sandbox up\n```\n", "X.md")


def test_in_order_runs_each_command_once_and_down_last() -> None:
    cmds = [Command("a", "scripts/sandbox down"), Command("a", "scripts/sandbox up  # one"),
            Command("b", "scripts/sandbox up   # another comment"),
            Command("b", "scripts/sandbox status")]
    assert [c.line for c in in_order(cmds)] == [
        "scripts/sandbox up  # one", "scripts/sandbox status", "scripts/sandbox down"]


def test_next_lines_are_read_from_ups_output() -> None:
    out = "sandbox: up finished\n\nSandbox 'x'\nNext:\n  scripts/sandbox verify\n  scripts/sandbox down\n"
    assert [c.line for c in next_lines(out)] == ["scripts/sandbox verify", "scripts/sandbox down"]
    assert next_lines("no next here") == []


def test_with_topology_replaces_only_the_inventory_path(tmp_path: Path) -> None:
    copy = tmp_path / "e2e-no-tls.yml"
    line = "ansible-playbook -i inventories/no-tls.yml playbooks/nodes.yml  # podman nodes"
    assert with_topology(line, "no-tls", copy) == \
        f"ansible-playbook -i {copy} playbooks/nodes.yml  # podman nodes"
    assert with_topology("scripts/sandbox up", "no-tls", copy) == "scripts/sandbox up"


def _sandbox_argv(line: str) -> list[str] | None:
    """The arguments of the first `scripts/sandbox` call on the line (inside $(...) too)."""
    words = shlex.split(line.replace("$(", " ").replace(")", " "), comments=True)
    for i, w in enumerate(words):
        if w == "scripts/sandbox":
            rest = words[i + 1:]
            for stop in ("|", "&&", "<", ";"):
                if stop in rest:
                    rest = rest[:rest.index(stop)]
            return rest
    return None


def _documented_lines() -> list[str]:
    lines = [c.line for c in collect() if not c.skip]
    for topology in ("default", "multi-tenant", "ha", "no-tls", "single"):
        lines += next_commands(load(topology))
    return lines


@pytest.mark.parametrize("line", _documented_lines())
def test_every_documented_sandbox_command_parses(line: str) -> None:
    """Each documented `scripts/sandbox ...` line is accepted by the CLI's own parser (a
    typo in a document fails here, without a sandbox)."""
    argv = _sandbox_argv(line)
    if argv is None:
        return
    ours, rest = split_passthrough(argv)
    args = build_parser().parse_args(ours)
    assert callable(args.func)
    if args.command in ("etcdctl", "kubectl", "ssh"):
        assert rest or args.command == "ssh", line


def test_the_documents_have_commands_to_run() -> None:
    found = [c for c in collect() if not c.skip and not c.sandbox]
    assert len(found) >= 15
    assert any(c.exit_code for c in found), "a documented failure is checked too"
    assert [c for c in collect() if c.sandbox == "no-tls"], "README's ansible-playbook block"
