"""The roles' argument specs (roles/<role>/meta/argument_specs.yml) as the CLI reads them.

Each role's ``main`` entry point declares the variables ``up --set`` takes; each day-2
operation has an entry point of its own (named after the task file its playbook includes
first, so Ansible checks the same options before that file runs), whose
``short_description`` is the command's help and whose options are the command's inputs:
``scripts/sandbox`` builds those options' ``--help`` and the check of their values from
them (:func:`argument`, :func:`check`), so a day-2 input is described once.
"""

from __future__ import annotations

import argparse
from typing import Any

from .argspecs import entry_points
from .context import UsageError
from .topology import REPO_ROOT

# argparse type names of the spec types a day-2 input may have.
SCALAR = {"str": str, "path": str, "int": int}


def entry(ref: str) -> dict[str, Any]:
    """The entry point ``role/entry`` (e.g. ``etcd/defrag/cluster``)."""
    role, _, name = ref.partition("/")
    try:
        return entry_points(role)[name] or {}
    except KeyError:
        raise KeyError(f"roles/{role}/meta/argument_specs.yml has no entry point '{name}'") from None


def summary(ref: str) -> str:
    """The entry point's short description, as a command's help line."""
    return str(entry(ref)["short_description"]).rstrip(".")


def option(ref: str, variable: str) -> dict[str, Any]:
    return (entry(ref).get("options") or {})[variable] or {}


def main_variables() -> set[str]:
    """Every variable a role's ``main`` entry point declares (what ``up --set`` takes)."""
    names: set[str] = set()
    for spec in sorted((REPO_ROOT / "roles").glob("*/meta/argument_specs.yml")):
        names.update((entry_points(spec.parent.parent.name).get("main") or {}).get("options") or {})
    return names


def argument(parser: argparse.ArgumentParser, ref: str, variable: str, *flags: str,
             **extra: Any) -> None:
    """Add the command-line argument for the input ``variable`` of entry point ``ref``
    (``flags`` such as ``--to``; none: a positional argument), stored under the variable's
    name: its help is the spec's description, its form the spec's type (bool: a flag; list:
    one or more values), ``required`` the spec's unless ``extra`` says otherwise (an option
    that selects a variant of the command); ``extra`` (metavar, ...) as argparse's."""
    spec = option(ref, variable)
    kind = str(spec.get("type") or "str")
    kw: dict[str, Any] = {"help": " ".join(str(spec.get("description") or "").split()), **extra}
    if kind == "bool":
        kw["action"] = "store_true"
    elif kind == "list":
        kw["nargs"] = "+"
    else:
        kw["type"] = SCALAR.get(kind, str)
    if spec.get("choices"):
        kw["choices"] = spec["choices"]
    if flags:
        kw["dest"] = variable
        if spec.get("required"):
            kw.setdefault("required", True)   # extra required=False: an option of a variant
        parser.add_argument(*flags, **kw)
    else:
        parser.add_argument(variable, **kw)


def values(args: argparse.Namespace, ref: str) -> dict[str, Any]:
    """The entry point's inputs the command line set (a flag left off is not passed)."""
    out: dict[str, Any] = {}
    for variable, spec in (entry(ref).get("options") or {}).items():
        value = getattr(args, variable, None)
        if value is None or (value is False and (spec or {}).get("type") == "bool"):
            continue
        out[variable] = value
    return out


def check(ref: str, given: dict[str, Any]) -> None:
    """Refuse, naming the input, a value whose type or choice the spec does not allow, or a
    required input left out: what Ansible would say when the playbook starts, said first."""
    options = entry(ref).get("options") or {}
    for variable, spec in options.items():
        spec = spec or {}
        if variable not in given:
            if spec.get("required"):
                raise UsageError(f"{variable}: required ({spec.get('description', '')})")
            continue
        value, kind = given[variable], str(spec.get("type") or "str")
        ok = {"bool": isinstance(value, bool), "list": isinstance(value, list),
              "int": isinstance(value, int) and not isinstance(value, bool)}.get(
                  kind, isinstance(value, str) and value != "")
        if not ok:
            raise UsageError(f"{variable}: {value!r} is not a {kind} value "
                             f"({' '.join(str(spec.get('description', '')).split())})")
        if spec.get("choices") and value not in spec["choices"]:
            raise UsageError(f"{variable}: {value!r} is not one of "
                             f"{', '.join(map(str, spec['choices']))}")
    unknown = sorted(set(given) - set(options))
    if unknown:
        raise UsageError(f"{', '.join(unknown)}: not an input of {ref} "
                         f"(roles/{ref.split('/')[0]}/meta/argument_specs.yml)")
