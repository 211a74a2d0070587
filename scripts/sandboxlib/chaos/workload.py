"""The chaos workload: an etcd agent per tenant on its first controller (etcd_agent.py, over
SSH) and API clients and watches from this host (api.py), all recorded into one History
whose times are seconds since the run's start (the nodes are containers on this host's
clock)."""

from __future__ import annotations

import json
import random
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from .. import kube, remote
from ..topology import Tenant, Topology
from . import api
from .history import History, Op, Watch, WatchEvent

AGENT = Path(__file__).with_name("etcd_agent.py")
AGENT_DIR = "/run/sandbox-chaos"


class WorkloadError(RuntimeError):
    """The workload could not start or end (one line)."""


@dataclass
class TenantRun:
    tenant: Tenant
    controller: str
    proc: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None
    etcd_watch: Watch | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    api_ep: api.Endpoint | None = None
    api_names: list[str] = field(default_factory=list)
    api_watches: list[tuple[Watch, api.ApiWatch, threading.Thread]] = field(default_factory=list)
    api_clients: list[threading.Thread] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


class Workload:
    def __init__(self, topo: Topology, backend: str, hist: History, run_id: str, seed: int,
                 clients: int, keys: int, max_seconds: float, workdir: Path) -> None:
        self.topo, self.backend, self.hist = topo, backend, hist
        self.run_id, self.seed, self.clients, self.keys = run_id, seed, clients, keys
        # The history's clock: CLOCK_MONOTONIC, which the nodes (podman containers of this
        # host: one kernel, no time namespace) share with the control node; the etcd agents
        # check that they do (etcd_agent.py). Deadlines stay on the wall clock.
        self.t0 = time.monotonic()
        self.deadline = time.time() + max_seconds
        self.max_seconds = max_seconds
        self.workdir = workdir
        self.lock = threading.Lock()
        self.api_stop = threading.Event()
        self.watch_stop = threading.Event()
        self.targets = remote.targets(topo, backend)
        self.runs = [TenantRun(t, t.controllers[0]) for t in topo.tenants]
        self.counter = 0

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add_op(self, **fields: Any) -> Op:
        with self.lock:
            op = Op(id=len(self.hist.ops), **fields)
            self.hist.ops.append(op)
            return op

    def value(self, tenant: str) -> str:
        with self.lock:
            self.counter += 1
            return f"chaos-{self.run_id}-{tenant}-a{self.counter}"

    # -- etcd: the agent on the controller --------------------------------------------------
    def external_cluster(self, run: TenantRun) -> dict[str, Any]:
        res = remote.run(self.targets[run.controller], "cat /etc/k0s/k0s.yaml", timeout=30)
        try:
            ext = yaml.safe_load(res.stdout)["spec"]["storage"]["etcd"]["externalCluster"]
        except (TypeError, KeyError, yaml.YAMLError):
            raise WorkloadError(f"chaos: no spec.storage.etcd.externalCluster in "
                                f"{run.controller}:/etc/k0s/k0s.yaml ({res.stderr.strip()[:120]}); "
                                "is the sandbox up? (scripts/sandbox status)") from None
        return dict(ext)

    def start_agent(self, run: TenantRun) -> None:
        ext = self.external_cluster(run)
        target = self.targets[run.controller]
        prefix = run.tenant.normalized_prefix
        cfg = {"t0": self.t0, "sent": time.monotonic(), "tenant": run.tenant.name, "run": self.run_id,
               "seed": self.seed, "clients": self.clients, "keys": self.keys,
               "prefix": f"{prefix}chaos/{self.run_id}/", "watch_prefix": prefix,
               "endpoints": ext["endpoints"], "cacert": ext.get("caFile"),
               "cert": ext.get("clientCertFile"), "key": ext.get("clientKeyFile"),
               "pace": 0.05, "max_seconds": self.max_seconds}
        copy = subprocess.run(
            remote.ssh_argv(target, f"mkdir -p -m 0700 {AGENT_DIR} && cat > {AGENT_DIR}/"
                            "etcd_agent.py"), input=AGENT.read_text(), capture_output=True,
            text=True, timeout=60, check=False)
        if copy.returncode != 0:
            raise WorkloadError(f"chaos: could not copy the etcd agent to {run.controller}: "
                                f"{copy.stderr.strip()[:200]}")
        cmd = f"python3 {AGENT_DIR}/etcd_agent.py {shlex.quote(json.dumps(cfg))}"
        run.proc = subprocess.Popen(remote.ssh_argv(target, cmd), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        run.reader = threading.Thread(target=self.read_agent, args=(run,), daemon=True)
        run.reader.start()
        threading.Thread(target=self._stderr, args=(run,), daemon=True).start()

    def _stderr(self, run: TenantRun) -> None:
        assert run.proc is not None and run.proc.stderr is not None
        for line in run.proc.stderr:
            run.stderr.append(line.rstrip()[:300])
            del run.stderr[:-20]

    def read_agent(self, run: TenantRun) -> None:
        assert run.proc is not None and run.proc.stdout is not None
        name = run.tenant.name
        for line in run.proc.stdout:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            kind = msg.get("type")
            w = run.etcd_watch
            if kind == "op":
                self.add_op(process=msg["process"], tenant=name, iface="etcd", kind=msg["kind"],
                            key=msg["key"], invoke=msg["invoke"], complete=msg.get("complete"),
                            outcome=msg["outcome"], value=msg.get("value"),
                            expected=msg.get("expected"),
                            consistency=msg.get("consistency") or "l",
                            result=msg.get("result") or {}, error=msg.get("error", ""))
            elif kind == "ready":
                with self.lock:
                    run.etcd_watch = Watch(name=f"{name}/etcd-watch", tenant=name, iface="etcd",
                                           prefix=run.tenant.normalized_prefix,
                                           start_rev=int(msg["start_rev"]))
                    self.hist.watches.append(run.etcd_watch)
                    self.hist.meta.setdefault("etcd_clients", {})[name] = {
                        "client": msg.get("client", "etcdctl"), "why": msg.get("client_why", "")}
                run.ready.set()
            elif kind == "event" and w is not None:
                with self.lock:
                    w.events.append(WatchEvent(msg["key"], int(msg["rev"]), msg["event"],
                                               msg.get("value"), float(msg["t"]),
                                               msg.get("resp")))
            elif kind == "restart" and w is not None:
                w.restarts.append({"t": msg["t"], "from": msg["from"], "reason": msg["reason"],
                                   "after": len(w.events)})
            elif kind == "progress" and w is not None:
                w.progress.append({"t": msg["t"], "rev": int(msg["rev"]),
                                   "after": len(w.events)})
            elif kind == "gap" and w is not None:
                w.reported_gaps.append({"from": msg["from"], "to": msg["to"], "why": msg["why"]})
            elif kind == "stopped":
                run.stopped.set()
            elif kind == "done" and w is not None:
                w.end_rev, w.reached_end = int(msg["end_rev"]) or None, bool(msg["reached_end"])
                w.end_reason = str(msg.get("why") or "")
                run.done.set()
        run.stopped.set()
        run.done.set()

    def tell(self, run: TenantRun, command: str) -> None:
        if run.proc is not None and run.proc.stdin is not None and run.proc.poll() is None:
            try:
                run.proc.stdin.write(command + "\n")
                run.proc.stdin.flush()
            except OSError:
                pass

    # -- the API: clients and watches from this host ---------------------------------------
    def start_api(self, run: TenantRun) -> None:
        path = kube.existing_kubeconfig(self.topo, run.tenant, "chaos")
        ep = api.endpoint(path, self.workdir)
        run.api_ep = ep
        api.ensure_crd(ep, time.time() + 90)
        run.api_names = [f"chaos-{self.run_id}-{run.tenant.name}-k{i}" for i in range(self.keys)]
        status, out = api.call(ep, "GET", api.RESOURCE)
        start = api.rv(out)
        if status != 200 or start is None:
            raise WorkloadError(f"chaos: listing {api.RESOURCE} for {run.tenant.name}: "
                                f"HTTP {status}")
        for ctrl in run.tenant.controllers:
            addr = self.topo.node(ctrl).address(self.backend)
            w = Watch(name=f"{run.tenant.name}/api-watch@{ctrl}", tenant=run.tenant.name,
                      iface="api", prefix=api.RESOURCE, start_rev=start)
            aw = api.ApiWatch(ep.at(addr), start, self._watch_sink(w), self.now,
                              self.watch_stop)
            th = threading.Thread(target=aw.run, args=(self.deadline,), daemon=True)
            self.hist.watches.append(w)
            run.api_watches.append((w, aw, th))
            th.start()
        for i in range(max(1, self.clients // 2)):
            rng = random.Random(f"{self.seed}-{run.tenant.name}-api-{i}")
            process = f"{run.tenant.name}/api-{i}"
            th = threading.Thread(target=api.client_loop, daemon=True, args=(
                ep, run.api_names, rng, lambda t=run.tenant.name: self.value(t),
                self._recorder(run.tenant.name, process), self.api_stop, 0.05))
            run.api_clients.append(th)
            th.start()

    def _watch_sink(self, w: Watch) -> Any:
        def sink(msg: dict[str, Any]) -> None:
            with self.lock:
                if msg["type"] == "event":
                    w.events.append(WatchEvent(msg["key"], int(msg["rev"]), str(msg["event"]),
                                               msg.get("value"), float(msg["t"])))
                elif msg["type"] == "restart":
                    w.restarts.append({**{k: msg[k] for k in ("t", "from", "reason")},
                                       "after": len(w.events)})
                elif msg["type"] == "gap":
                    w.reported_gaps.append({k: msg[k] for k in ("from", "to", "why")})
        return sink

    def _recorder(self, tenant: str, process: str) -> Any:
        def record(kind: str, name: str, value: str | None, expected: int | None, t0: float,
                   t1: float, outcome: str, result: dict[str, Any], error: str) -> None:
            self.add_op(process=process, tenant=tenant, iface="api", kind=kind, key=name,
                        invoke=t0 - self.t0, complete=t1 - self.t0, outcome=outcome,
                        value=value, expected=expected, result=result, error=error)
        return record

    def api_final(self, run: TenantRun) -> None:
        """Read every resource once more, then write the end marker and wait for the
        watches to deliver it."""
        assert run.api_ep is not None
        record = self._recorder(run.tenant.name, f"{run.tenant.name}/final")
        for name in run.api_names:
            for _ in range(20):
                t0 = time.monotonic()
                outcome, result, error = api.run_op(run.api_ep, "read", name)
                record("read", name, None, None, t0, time.monotonic(), outcome, result, error)
                if outcome == "ok":
                    break
                time.sleep(1)
        end_rev, why = self.api_marker(run, record)
        deadline = time.time() + 30
        for w, aw, _ in run.api_watches:
            w.end_rev = end_rev
            while end_rev is not None and aw.last < end_rev and time.time() < deadline:
                time.sleep(0.2)
            w.reached_end = end_rev is not None and aw.last >= end_rev
            w.end_reason = why if end_rev is None else "" if w.reached_end else (
                f"not delivered within 30 s (last event at revision {aw.last})")

    def api_marker(self, run: TenantRun, record: Any) -> tuple[int | None, str]:
        """Create the end marker: its resourceVersion, or None and why. A create of unknown
        outcome whose retry answers 409 AlreadyExists did commit: the marker is read back."""
        assert run.api_ep is not None
        marker = f"chaos-{self.run_id}-{run.tenant.name}-end"
        why = "the end marker's create never answered"
        for _ in range(20):
            t0 = time.monotonic()
            outcome, result, error = api.run_op(run.api_ep, "create", marker, marker)
            record("create", marker, marker, None, t0, time.monotonic(), outcome, result, error)
            if outcome == "ok" and result.get("rev"):
                return int(result["rev"]), ""
            if outcome == "ok" and result.get("exists"):
                t0 = time.monotonic()
                outcome, result, error = api.run_op(run.api_ep, "read", marker)
                record("read", marker, None, None, t0, time.monotonic(), outcome, result, error)
                if outcome == "ok" and result.get("value") == marker and result.get("rev"):
                    return int(result["rev"]), ""
                why = f"the end marker exists but could not be read back ({error or result})"
            else:
                why = f"the end marker's create: {outcome} {error}".strip()
            time.sleep(1)
        return None, why + " (20 tries)"

    # -- the run ---------------------------------------------------------------------------------
    def start(self) -> None:
        for run in self.runs:
            self.start_agent(run)
        for run in self.runs:
            if not run.ready.wait(60):
                raise WorkloadError(f"chaos: the etcd agent on {run.controller} did not start: "
                                    f"{' / '.join(run.stderr[-3:]) or 'no output'}")
        for run in self.runs:
            self.start_api(run)

    def stop(self) -> None:
        """The clients stop (what is under way finishes, bounded)."""
        for run in self.runs:
            self.tell(run, "stop")
        self.api_stop.set()
        for run in self.runs:
            run.stopped.wait(60)
            for th in run.api_clients:
                th.join(timeout=30)

    def finish(self) -> None:
        """Final reads and end markers (after the faults were healed); then everything ends."""
        for run in self.runs:
            self.tell(run, "final")
        for run in self.runs:
            self.api_final(run)
        for run in self.runs:
            run.done.wait(180)
        self.watch_stop.set()
        for run in self.runs:
            for _, _, th in run.api_watches:
                th.join(timeout=20)
        self.end_agents()

    def abort(self) -> None:
        """Everything stops at once (an error or Ctrl-C): the agents lose their stdin."""
        self.api_stop.set()
        self.watch_stop.set()
        self.end_agents()

    def end_agents(self) -> None:
        for run in self.runs:
            if run.proc is not None:
                close(run.proc.stdin)
                try:
                    run.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    run.proc.kill()

    def cleanup(self) -> None:
        """The run's keys and custom resources (the CRD stays for the next run)."""
        for run in self.runs:
            for name in [*run.api_names, f"chaos-{self.run_id}-{run.tenant.name}-end"]:
                if run.api_ep is not None:
                    api.run_op(run.api_ep, "delete", name)
            ext = self.external_cluster(run)
            flags = " ".join(f"--{k}={shlex.quote(str(ext[v]))}" for k, v in
                             (("cacert", "caFile"), ("cert", "clientCertFile"),
                              ("key", "clientKeyFile")) if ext.get(v))
            remote.run(self.targets[run.controller],
                       f"etcdctl --endpoints={','.join(ext['endpoints'])} {flags} del --prefix "
                       f"{shlex.quote(run.tenant.normalized_prefix + 'chaos/' + self.run_id + '/')}"
                       f" >/dev/null; rm -rf {AGENT_DIR}", timeout=60)


def close(stream: IO[str] | None) -> None:
    if stream is not None:
        try:
            stream.close()
        except OSError:
            pass
