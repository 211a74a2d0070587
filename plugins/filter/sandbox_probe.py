"""Probe once, change only what differs: the one comparison every role uses.

Each role reads its node in one round trip (its tasks/probe.yml) and prints, for every file
and directory it manages, ``file:<path>=<sha256> <mode>:<owner>:<group>`` (a directory:
``dir <mode>:<owner>:<group>``). A task then describes the file once, as an entry
(``dest``, one of ``content`` / ``src`` / ``sha256`` or ``state: directory``, and ``mode``,
``owner``, ``group``), uses the same entry for the module's arguments, and runs only where
``probe | probe_differs(entry)`` (or loops over ``entries | probe_stale(probe)``).
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Any


def probe_file_sha256(path: str) -> str:
    """sha256 of a control-node file ('' when it cannot be read)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return ""
    return digest.hexdigest()


def probe_want(entry: dict[str, Any]) -> str:
    """What the probe prints for a path that is as ``entry`` says."""
    attrs = f"{int(str(entry['mode']), 8):o}:{entry['owner']}:{entry['group']}"
    if entry.get("state") == "directory":
        return f"dir {attrs}"
    if "sha256" in entry:
        digest = entry["sha256"]
    elif "content" in entry:
        digest = hashlib.sha256(str(entry["content"]).encode()).hexdigest()
    else:
        digest = probe_file_sha256(entry["src"])
    return f"{digest} {attrs}"


def probe_differs(probe: dict[str, str], entry: dict[str, Any]) -> bool:
    """True when the node's ``entry['dest']`` is missing or not what the entry says."""
    return probe.get(f"file:{entry['dest']}", "") != probe_want(entry)


def probe_stale(entries: list[dict[str, Any]], probe: dict[str, str]) -> list[dict[str, Any]]:
    """The entries whose path on the node is missing or not what they say."""
    return [entry for entry in entries if probe_differs(probe, entry)]


def probe_contents(entries: list[dict[str, Any]], base: str = "") -> list[dict[str, Any]]:
    """The entries with ``src`` (a control-node text file, relative to ``base``) turned into
    ``content`` (read whole, trailing newline kept), for the sandbox_files module."""
    out = []
    for entry in entries:
        if "src" in entry:
            path = os.path.join(base, entry["src"])
            with open(path, encoding="utf-8") as fh:
                entry = {**{k: v for k, v in entry.items() if k != "src"}, "content": fh.read()}
        out.append(entry)
    return out


def probe_local_differs(path: str, content: str, mode: str) -> bool:
    """True when the control-node file ``path`` is missing or does not hold exactly
    ``content`` with ``mode``: a task that writes it (delegated to the control node) runs
    only then, without a module run to find out."""
    try:
        with open(path, "rb") as fh:
            same = fh.read() == str(content).encode()
        return not same or stat.S_IMODE(os.stat(path).st_mode) != int(str(mode), 8)
    except OSError:
        return True


def probe_link_plan(entries: list[dict[str, Any]], probe: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Link or copy, for entries that name a ``mounted`` path: a read-only copy of the file
    on the node (a bind mount of the control node's file, read by the probe ON the node).

    ``link``: the mounted file is as the entry says (checksum, mode, owner) and ``dest`` is
    not yet a link to it; each gets ``restart`` (whether ``dest`` held other contents).
    ``push`` (a copy): the mounted file is missing or differs (a node made without the mount, a
    rebuilt source), and ``dest`` is missing, differs, or is a link. Entries already right
    are in neither."""
    plan: dict[str, list[dict[str, Any]]] = {"link": [], "push": []}
    for entry in entries:
        mounted = entry.get("mounted")
        if mounted and not probe_differs(probe, {**entry, "dest": mounted}):
            if probe.get(f"link:{entry['dest']}") != mounted:
                plan["link"].append({**entry, "restart": probe_differs(probe, entry)})
        elif probe_differs(probe, entry) or f"link:{entry['dest']}" in probe:
            plan["push"].append(entry)
    return plan


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"probe_file_sha256": probe_file_sha256, "probe_want": probe_want,
                "probe_differs": probe_differs, "probe_stale": probe_stale,
                "probe_contents": probe_contents, "probe_link_plan": probe_link_plan,
                "probe_local_differs": probe_local_differs}
