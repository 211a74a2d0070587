"""The roles' argument specs (roles/<role>/meta/argument_specs.yml) as read from disk, once
per process: what ``specs`` builds the day-2 commands' options from and what ``topology``
refuses in a topology's vars (a day-2 command's input). Every entry point other than a
role's ``main`` is a day-2 operation's (tests/test_hostile_files.py keeps each one a row's
of day2.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

ROLES = Path(__file__).resolve().parents[2] / "roles"


@functools.cache
def entry_points(role: str) -> dict[str, Any]:
    """A role's argument_specs: entry point -> {short_description, options}."""
    path = ROLES / role / "meta" / "argument_specs.yml"
    # libyaml's loader where PyYAML has it: 7x faster, and every command reads these files
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return (yaml.load(path.read_text(encoding="utf-8"), Loader=loader) or {}).get("argument_specs") or {}


@functools.cache
def command_inputs() -> frozenset[str]:
    """Every option of every day-2 entry point (each role's entry points but ``main``)."""
    return frozenset(option for spec in sorted(ROLES.glob("*/meta/argument_specs.yml"))
                     for name, entry in entry_points(spec.parent.parent.name).items()
                     if name != "main" for option in (entry or {}).get("options") or {})
