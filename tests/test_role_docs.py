"""Each role's variables are described once and agree everywhere: every variable in
defaults/main.yml is declared in meta/argument_specs.yml (and the reverse), a default the
spec states is the defaults file's value, and the role's README names every variable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ROLES = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))


def _entry_points(role: str) -> dict[str, Any]:
    spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]


def _options(role: str) -> dict[str, Any]:
    """The role's own variables: its main entry point's options."""
    return _entry_points(role)["main"].get("options") or {}


DAY2 = [(role, name) for role in ROLES for name in _entry_points(role) if name != "main"]


@pytest.mark.parametrize(("role", "name"), DAY2, ids=[f"{r}/{n}" for r, n in DAY2])
def test_day2_entry_points_are_checked_and_documented(role: str, name: str) -> None:
    """A day-2 operation's entry point is named after a task file (Ansible checks its options
    when a playbook includes that file), says what the operation does (the command's help),
    and its inputs are described and named in docs/day2.md (or, for a short one, its row in
    docs/cli.md); none is a role default."""
    entry = _entry_points(role)[name]
    assert (REPO / "roles" / role / "tasks" / f"{name}.yml").is_file()
    assert str(entry.get("short_description") or "").strip()
    options = entry.get("options") or {}
    docs = (REPO / "docs" / "day2.md").read_text() + (REPO / "docs" / "cli.md").read_text()
    assert [k for k, o in options.items() if not str(o.get("description") or "").strip()] == []
    assert [k for k in options if f"{k}" not in docs] == [], "not named in docs/day2.md or docs/cli.md"
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    assert sorted(set(options) & set(defaults)) == []


def test_every_role_is_covered() -> None:
    assert ROLES == sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())


@pytest.mark.parametrize("role", ROLES)
def test_defaults_specs_and_readme_agree(role: str) -> None:
    options = _options(role)
    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    readme = (REPO / "roles" / role / "README.md").read_text()
    assert sorted(set(defaults) - set(options)) == [], "in defaults/main.yml, not in the spec"
    assert sorted(set(options) - set(defaults)) == [], "in the spec, without a default"
    differ = {k: (o["default"], defaults[k]) for k, o in options.items()
              if "default" in o and o["default"] != defaults[k]}
    assert differ == {}, "the spec's default is not the defaults file's"
    assert [k for k in options if f"`{k}`" not in readme] == [], "not named in README.md"
    assert [k for k, o in options.items() if not str(o.get("description") or "").strip()] == []


@pytest.mark.parametrize("role", ROLES)
def test_the_collection_docs_list_every_role_and_ansible_doc_every_entry_point(role: str) -> None:
    """docs/collection.md's table has each role's `main` row, by FQCN; `ansible-doc -t role`
    (what docs/collection.md sends a user to) renders every entry point of the spec with its
    short description -- a new day-2 entry point needs no line in the docs to be listed."""
    rows = (REPO / "docs" / "collection.md").read_text().splitlines()
    assert any(r.startswith(f"| `k0sbox.external_etcd.{role}` | `main` |") for r in rows), \
        f"docs/collection.md: no row for {role}"
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-doc"), "-t", "role", "-j",
                           f"k0sbox.external_etcd.{role}"], cwd=REPO, capture_output=True,
                          text=True, check=True)
    shown = json.loads(done.stdout)[f"k0sbox.external_etcd.{role}"]["entry_points"]
    assert {k: v.get("short_description") for k, v in shown.items()} == {
        k: v.get("short_description") for k, v in _entry_points(role).items()}
