"""A CLI command as one declarative row (issue 37): :class:`Row` says the command's name,
its operation's argument-spec entry point (roles/<role>/meta/argument_specs.yml: the
command's help, its options' help, types and checks), its arguments, its playbook, its
guards and its closing line; a ``--tenant`` variant is a row in its command's ``variants``.
day2.py holds the rows and runs them; this module is their shape and what needs no command
name: the variant a command line selects, a tenant named on it."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from . import specs
from .context import Sandbox, UsageError, resolve


@dataclass(frozen=True)
class Arg:
    """A command-line argument: the input ``variable`` of the row's entry point (or of
    ``entry``: a variant's input, or one the playbook passes on), given with ``flags`` (none:
    positional). Its help, type and check are the spec's (specs.argument); ``required``
    False for an option that selects a variant; ``plain`` for a flag no spec declares (a
    confirmation, with its own ``help``)."""

    variable: str
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    entry: str = ""
    required: bool | None = None
    help: str | None = None
    plain: bool = False

    def add_to(self, parser: argparse.ArgumentParser, row_entry: str) -> None:
        if self.plain:
            parser.add_argument(*self.flags, dest=self.variable, action="store_true",
                                help=self.help)
            return
        extra = {k: v for k, v in (("metavar", self.metavar), ("required", self.required),
                                   ("help", self.help)) if v is not None}
        specs.argument(parser, self.entry or row_entry, self.variable, *self.flags, **extra)


@dataclass
class Call:
    """One run of a row: the command line, the sandbox (resolved once, when first asked),
    the inputs the playbook gets (the entry point's options the command line set, then what
    the guard adds)."""

    args: argparse.Namespace
    extra: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def sb(self) -> Sandbox:
        return resolve(self.args)


@dataclass(frozen=True)
class Row:
    """A day-2 command, or a ``--tenant`` variant of one (in its command's ``variants``)."""

    name: str
    entry: str                                  # role/entry point: help, inputs, their checks
    playbook: str
    done: Callable[[Call, float], str]          # the closing line (took: seconds)
    arguments: tuple[Arg, ...] = ()             # the command's, its variants' too, in order
    guard: Callable[[Call], None] | None = None  # checks, the opening line, more inputs
    before: tuple[str, ...] = ()                # playbooks run first, without inputs
    variants: tuple[Row, ...] = ()
    selector: str = ""      # a variant's: the input naming the tenant that selects it
    alone: tuple[str, ...] = ()   # a variant's: the command's flags for the cluster-wide one only
    what: str = ""          # a variant's: what it acts on (its options given without it)


def tenant_named(call: Call, command: str, name: str) -> Any:
    """The topology's tenant ``name``; else a UsageError listing the tenants."""
    topo = call.sb.topo
    for t in topo.tenants:
        if t.name == name:
            return t
    raise UsageError(f"{command} --tenant: no tenant '{name}' in topology '{topo.name}'; "
                     f"tenants: {', '.join(t.name for t in topo.tenants) or 'none'}")


def selected(row: Row, args: argparse.Namespace) -> Row:
    """The variant whose selector the command line set, else the row; refuses an option of
    one given with the other (nothing has run)."""
    flags = {flag: arg.variable for arg in row.arguments for flag in arg.flags}
    for variant in row.variants:
        if getattr(args, variant.selector):
            given = [flag for flag in variant.alone if getattr(args, flags[flag])]
            if given:
                raise UsageError(f"{row.name} --tenant: {', '.join(given)} goes with a "
                                 f"cluster-wide {row.name}, not with one tenant's; nothing "
                                 "was changed")
            return variant
    for variant in row.variants:
        own = [a for a in row.arguments if a.entry == variant.entry and a.variable != variant.selector]
        if any(getattr(args, a.variable) for a in own):
            raise UsageError(f"{row.name}: {' and '.join(a.flags[0] for a in own)} go with "
                             f"--tenant T ({variant.what}); nothing was changed")
    return row
