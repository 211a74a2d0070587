"""The control node's record of the last finished converge: ``<state dir>/converged.json``.

fingerprint.py writes it after a converge and compares with it before the next ``up``; every
command that may change the sandbox removes it first (runner.run_context), so that the next
``up`` converges. Here, below both, so that the runner needs nothing of the fingerprint.
"""

from __future__ import annotations

from pathlib import Path

from .topology import Topology

RECORD = "converged.json"            # in the state dir


def path(topo: Topology) -> Path:
    """Where the control node's record of ``topo`` is."""
    return topo.state_dir / RECORD


def forget(topo: Topology) -> None:
    """The next ``up`` converges (a command is about to change the sandbox)."""
    path(topo).unlink(missing_ok=True)
