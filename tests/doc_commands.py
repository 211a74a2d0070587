"""The shell lines of the project's documents, to be run as typed (tests/test_cli_e2e.py,
tests/test_topologies_e2e.py; the parser's own tests: tests/test_doc_commands.py).

Every line of a fenced ``sh`` block of README.md and docs/cli.md is a command a user may type
from the repository root. Blank and comment-only lines are not; a line ending in ``\\`` goes
on with the next. What a block or a line needs besides a running sandbox is said in an HTML
comment of the document (invisible when rendered), placed anywhere before the line it is
about:

    <!-- doc-test: skip "PREFIX" REASON -->      lines starting with PREFIX are not run
    <!-- doc-test: fails "PREFIX" exit N -->     they must fail with exit code N
    <!-- doc-test: sandbox TOPOLOGY -->           the next block brings up its own sandbox of
                                                  TOPOLOGY (run by test_topologies_e2e.py)

Lines that end the sandbox (``scripts/sandbox down``) run after all the others.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/cli.md")
MARKER = re.compile(r"<!--\s*doc-test:\s*(skip|fails|sandbox)\s+(.*?)\s*-->")
FENCE = re.compile(r"^\s*```(\S*)\s*$")
ENDS_SANDBOX = ("scripts/sandbox down",)


class DocError(ValueError):
    """A document's markers do not fit its lines."""


@dataclass(frozen=True)
class Command:
    source: str           # "README.md:30"
    line: str             # as typed (continuations joined)
    sandbox: str = ""     # "" = the shared running sandbox; else a topology of its own
    skip: str = ""        # why it is not run
    exit_code: int = 0    # the exit code it must end with

    @property
    def ends_sandbox(self) -> bool:
        return self.line.startswith(ENDS_SANDBOX)


def _parse_marker(kind: str, rest: str, where: str) -> tuple[str, str]:
    if kind == "sandbox":
        if not re.fullmatch(r"[\w.-]+", rest):
            raise DocError(f"{where}: doc-test sandbox takes one topology name, not {rest!r}")
        return rest, ""
    m = re.fullmatch(r'"([^"]+)"\s+(.+)', rest)
    if not m:
        raise DocError(f'{where}: doc-test {kind} takes "PREFIX" and a reason, not {rest!r}')
    if kind == "fails" and not re.fullmatch(r"exit \d+", m.group(2)):
        raise DocError(f'{where}: doc-test fails "PREFIX" takes "exit N", not {m.group(2)!r}')
    return m.group(1), m.group(2)


def commands(text: str, name: str) -> list[Command]:
    """The commands of one document, in order; DocError when a marker is malformed or
    matches no line after it."""
    out: list[Command] = []
    rules: list[tuple[str, str, str, str]] = []   # kind, prefix, value, where
    used: set[int] = set()
    block = ""                       # "" outside a fence, else its language ("sh", ...)
    block_sandbox, next_sandbox, pending = "", "", ""
    start = 0
    for no, raw in enumerate(text.splitlines(), 1):
        fence = FENCE.match(raw)
        if fence:
            if block:
                block = ""
            else:
                block = fence.group(1) or "text"
                block_sandbox, next_sandbox = next_sandbox, ""
            continue
        if not block:
            for m in MARKER.finditer(raw):
                where = f"{name}:{no}"
                value, reason = _parse_marker(m.group(1), m.group(2), where)
                if m.group(1) == "sandbox":
                    next_sandbox = value
                else:
                    rules.append((m.group(1), value, reason, where))
            continue
        if block not in ("sh", "bash", "shell"):
            continue
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if not pending:
            start = no
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        full = pending + line
        pending = ""
        skip, code = "", 0
        for i, (kind, prefix, value, _where) in enumerate(rules):
            if full.startswith(prefix):
                used.add(i)
                if kind == "skip":
                    skip = value
                else:
                    code = int(value.split()[1])
        out.append(Command(f"{name}:{start}", full, block_sandbox, skip, code))
    stale = [where for i, (_k, _p, _v, where) in enumerate(rules) if i not in used]
    if stale:
        raise DocError(f"doc-test markers that match no command after them: {', '.join(stale)}")
    return out


def collect(root: Path = REPO_ROOT, documents: tuple[str, ...] = DOCUMENTS) -> list[Command]:
    found: list[Command] = []
    for doc in documents:
        found += commands((root / doc).read_text(encoding="utf-8"), doc)
    return found


def next_lines(up_output: str) -> list[Command]:
    """The commands ``up`` prints under "Next:" (to the end of its output)."""
    _, sep, rest = up_output.partition("\nNext:\n")
    if not sep:
        return []
    return [Command("up's Next:", ln.strip()) for ln in rest.splitlines()
            if ln.startswith("  ") and ln.strip()]


def in_order(cmds: list[Command]) -> list[Command]:
    """Each line once, in order, the ones that end the sandbox last."""
    seen: set[str] = set()
    unique = []
    for c in cmds:
        key = re.sub(r"\s+#\s.*$", "", c.line)   # the same command with another comment
        if key not in seen:
            seen.add(key)
            unique.append(c)
    return [c for c in unique if not c.ends_sandbox] + [c for c in unique if c.ends_sandbox]


def with_topology(line: str, shipped: str, copy: Path) -> str:
    """The line with the shipped topology file (inventories/<name>.yml) replaced by the
    test's copy of it (its own name and subnet), the only change made to a typed line."""
    words = shlex.split(line, comments=True)
    target = f"inventories/{shipped}.yml"
    if target not in words:
        return line
    return line.replace(target, str(copy))
