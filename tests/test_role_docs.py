"""Each role's variables are described once and agree everywhere: every variable in
defaults/main.yml is declared in meta/argument_specs.yml (and the reverse), a default the
spec states is the defaults file's value, and the role's README names every variable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
ROLES = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))


def _options(role: str) -> dict[str, Any]:
    spec = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())
    options: dict[str, Any] = {}
    for entry in spec["argument_specs"].values():
        options.update(entry.get("options") or {})
    return options


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
