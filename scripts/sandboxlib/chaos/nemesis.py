"""The faults of ``scripts/sandbox chaos``, each injected on the sandbox's OWN etcd members
(the topology's ``etcd`` group, its containers and its podman network, nothing else) and
healed, each step bounded in time:

=================  ===========================================================================
kill-leader        SIGKILL of the leader's etcd (``systemctl kill``); systemd restarts it
kill-follower      the same on a follower
pause-leader       SIGSTOP of the leader's etcd for 3x the election timeout (at least 3 s), SIGCONT
disconnect-member  a member cut off the podman network, reattached with its own address
partition-leader   the leader cut off from the other members only (iptables DROP of their
                   addresses in its network namespace, entered from this host): it still
                   answers clients, which must not see stale linearizable reads
kill-all           SIGKILL of every member's etcd at once; systemd restarts them
replace-member     a follower replaced (playbooks/replace-member.yml with force: removed,
                   its data wiped, added again, synced)
=================  ===========================================================================

``heal_all`` undoes anything a fault may have left (SIGCONT, rules, network, stopped units)
and ``healthy`` waits for every member's health and equal hashkv.
"""

from __future__ import annotations

import json
import random
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import remote
from ..topology import Node, Topology
from .history import Fault

FAULTS = ("kill-leader", "kill-follower", "pause-leader", "disconnect-member",
          "partition-leader", "kill-all", "replace-member")
HEALTH_TIMEOUT = 180.0


class NemesisError(RuntimeError):
    """A fault could not be injected or healed (one line)."""


@dataclass
class Nemesis:
    topo: Topology
    backend: str
    rng: random.Random
    now: Callable[[], float]
    say: Callable[[str], None]
    run_replace: Callable[[str], None]        # replace-member.yml for that member
    rules: list[tuple[str, list[str]]] = field(default_factory=list)   # (container, rule)
    disconnected: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.members: list[Node] = self.topo.group("etcd")
        self.targets = remote.targets(self.topo, self.backend)
        if self.backend != "podman":
            raise NemesisError("chaos: the faults act on podman containers and networks; "
                               "run it on a podman sandbox (--backend podman)")

    # -- what the cluster looks like ---------------------------------------------------------
    def own(self, name: str) -> Node:
        """A member of THIS sandbox, or an error (nothing else is ever touched)."""
        for n in self.members:
            if n.name == name:
                return n
        raise NemesisError(f"chaos: {name} is not an etcd member of '{self.topo.name}'")

    def ssh(self, name: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return remote.run(self.targets[self.own(name).name], command, timeout=timeout)

    def status(self) -> list[dict[str, Any]]:
        """``etcdctl endpoint status --cluster`` from the first member that answers."""
        for m in self.members:
            res = self.ssh(m.name, "etcdctl --command-timeout=5s endpoint status --cluster -w json",
                           timeout=20)
            if res.returncode == 0:
                try:
                    out = json.loads(res.stdout)
                except ValueError:
                    continue
                if isinstance(out, list) and out:
                    return out
        return []

    def leader(self) -> str:
        """The leader's node name (asked for up to 30 s)."""
        deadline = time.time() + 30
        while time.time() < deadline:
            for s in self.status():
                st = s.get("Status") or {}
                if st.get("leader") and st.get("leader") == (st.get("header") or {}).get("member_id"):
                    host = str(s.get("Endpoint", "")).split("//")[-1].rsplit(":", 1)[0]
                    for m in self.members:
                        if m.address(self.backend) == host:
                            return m.name
            time.sleep(1)
        raise NemesisError("chaos: no etcd leader found for 30 s (scripts/sandbox status)")

    def follower(self, leader: str) -> str:
        return self.rng.choice([m.name for m in self.members if m.name != leader])

    def election_timeout_ms(self) -> int:
        res = self.ssh(self.members[0].name,
                       "sed -n 's/^ETCD_ELECTION_TIMEOUT=//p' /etc/etcd/etcd.env")
        raw = res.stdout.strip().strip('"')
        return int(raw) if raw.isdigit() else 1000

    # Every member healthy; then the KV hash of every member at the lowest revision they
    # all have (clients may be writing: at each member's latest revision they would differ).
    HEALTH = ("etcdctl --command-timeout=5s endpoint health --cluster >/dev/null && "
              "rev=$(etcdctl --command-timeout=5s endpoint status --cluster -w json | python3 -c "
              "'import json,sys; print(min(s[\"Status\"][\"header\"][\"revision\"] "
              "for s in json.load(sys.stdin)))') && "
              "etcdctl --command-timeout=5s endpoint hashkv --cluster --rev=$rev -w json")

    def healthy(self, timeout: float = HEALTH_TIMEOUT) -> str:
        """'' once every member is healthy with equal hashkv; else why not (after timeout)."""
        deadline = time.time() + timeout
        why = "not asked"
        while time.time() < deadline:
            for m in self.members:
                res = self.ssh(m.name, self.HEALTH, timeout=30)
                if res.returncode != 0:
                    last = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["?"]
                    why = f"{m.name}: {last[0][:200]}"
                    continue
                try:
                    hashes = [h["HashKV"]["hash"] for h in json.loads(res.stdout)]
                except (ValueError, KeyError, TypeError):
                    why = f"{m.name}: unreadable hashkv {res.stdout[:100]!r}"
                    continue
                if len(hashes) == len(self.members) and len(set(hashes)) == 1:
                    return ""
                why = f"hashkv differs or is incomplete: {hashes}"
                break
            time.sleep(2)
        return why

    # -- podman --------------------------------------------------------------------------------
    def container(self, name: str) -> str:
        return self.topo.container_name(self.own(name))

    def podman(self, *args: str, check: bool = True) -> str:
        res = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=60,
                             check=False)
        if check and res.returncode != 0:
            raise NemesisError(f"chaos: podman {' '.join(args)}: {res.stderr.strip()[:200]}")
        return res.stdout

    def attached(self, name: str) -> bool:
        out = self.podman("inspect", "--format", "{{json .NetworkSettings.Networks}}",
                          self.container(name), check=False)
        try:
            nets = json.loads(out or "{}") or {}
        except ValueError:
            return False
        net = nets.get(self.topo.network_name()) or {}
        return net.get("IPAddress") == self.own(name).address(self.backend)

    def iptables(self, container: str, rule: list[str], add: bool) -> None:
        pid = self.podman("inspect", "--format", "{{.State.Pid}}", container).strip()
        if not pid.isdigit() or pid == "0":
            raise NemesisError(f"chaos: {container} is not running")
        cmd = ["nsenter", "-t", pid, "-n", "iptables", "-I" if add else "-D", *rule]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
        if res.returncode != 0 and add:
            raise NemesisError(f"chaos: {shlex.join(cmd)}: {res.stderr.strip()[:200]}")

    # -- the faults ----------------------------------------------------------------------------
    def signal(self, names: list[str], sig: str) -> None:
        jobs = [(self.targets[self.own(n).name], f"systemctl kill --signal={sig} etcd")
                for n in names]
        for n, res in zip(names, remote.run_many(jobs, timeout=30), strict=True):
            if res.returncode != 0:
                raise NemesisError(f"chaos: {sig} to etcd on {n}: {res.stderr.strip()[:200]}")

    def inject(self, fault: str, hold: float) -> Fault:
        """Inject ``fault``, hold it ``hold`` seconds where it lasts, heal it; the record."""
        leader = self.leader()
        rec = Fault(name=fault, target="", start=0.0)
        if fault == "kill-leader" or fault == "kill-follower":
            rec.target = leader if fault == "kill-leader" else self.follower(leader)
            rec.start = self.now()
            self.signal([rec.target], "SIGKILL")
            rec.injected = self.now()
            rec.note = "systemd restarts it (RestartSec)"
        elif fault == "kill-all":
            rec.target = ",".join(m.name for m in self.members)
            rec.start = self.now()
            self.signal([m.name for m in self.members], "SIGKILL")
            rec.injected = self.now()
            rec.note = "systemd restarts them (RestartSec)"
        elif fault == "pause-leader":
            rec.target = leader
            pause = max(3.0, 3 * self.election_timeout_ms() / 1000)
            rec.start = self.now()
            self.signal([leader], "SIGSTOP")
            rec.injected = self.now()
            try:
                time.sleep(pause)
            finally:
                self.signal([leader], "SIGCONT")
            rec.note = f"paused {pause:.1f}s (3x the election timeout)"
        elif fault == "disconnect-member":
            rec.target = self.rng.choice([m.name for m in self.members])
            rec.start = self.now()
            self.disconnected.add(rec.target)
            self.podman("network", "disconnect", self.topo.network_name(),
                        self.container(rec.target))
            rec.injected = self.now()
            try:
                time.sleep(hold)
            finally:
                self.reconnect(rec.target)
            rec.note = f"{'the leader' if rec.target == leader else 'a follower'}, {hold:.0f}s"
        elif fault == "partition-leader":
            rec.target = leader
            c = self.container(leader)
            peers = [m.address(self.backend) for m in self.members if m.name != leader]
            rules = [r for p in peers for r in (["INPUT", "-s", p, "-j", "DROP"],
                                                ["OUTPUT", "-d", p, "-j", "DROP"])]
            rec.start = self.now()
            try:
                for r in rules:
                    self.rules.append((c, r))
                    self.iptables(c, r, add=True)
                rec.injected = self.now()
                time.sleep(hold)
            finally:
                self.unpartition()
            rec.note = f"from {', '.join(peers)} for {hold:.0f}s; clients still reach it"
        elif fault == "replace-member":
            rec.target = self.follower(leader)
            rec.start = self.now()
            self.run_replace(rec.target)
            rec.note = "replace-member.yml with force (removed, wiped, added, synced)"
        else:
            raise NemesisError(f"chaos: unknown fault {fault!r}; faults: {', '.join(FAULTS)}")
        rec.healed = self.now()
        why = self.healthy()
        if why:
            rec.note += f"; NOT healthy after {HEALTH_TIMEOUT:.0f}s: {why}"
        else:
            rec.end = self.now()
        self.say(f"    {fault} on {rec.target}: healed after {rec.healed - rec.start:.1f}s, "
                 + (f"healthy after {rec.end - rec.start:.1f}s" if rec.end else "NOT healthy"))
        return rec

    def reconnect(self, name: str) -> None:
        if not self.attached(name):
            self.podman("network", "connect", "--ip", self.own(name).address(self.backend),
                        self.topo.network_name(), self.container(name), check=False)
        if self.attached(name):
            self.disconnected.discard(name)

    def unpartition(self) -> None:
        while self.rules:
            c, r = self.rules.pop()
            self.iptables(c, r, add=False)

    def heal_all(self) -> str:
        """Undo whatever a fault may have left; '' when the cluster is healthy after."""
        self.unpartition()
        for m in self.members:
            self.reconnect(m.name)
        heal = ("systemctl kill --signal=SIGCONT etcd 2>/dev/null; "
                "systemctl reset-failed etcd 2>/dev/null; systemctl start etcd")
        jobs = [(self.targets[m.name], heal) for m in self.members]
        remote.run_many(jobs, timeout=60)
        return self.healthy()
