"""``scripts/sandbox bench``: how fast the sandbox comes up, against the floor.

On the podman backend, with several repetitions and medians:
  1. cold ``up`` of the default topology (node image present, no nodes, no PKI),
  2. warm ``up --force`` with nothing changed (the full converge; must report changed=0),
     then a no-op ``up`` (the check alone: must say "nothing to change"),
  3. ``down``,
  4. cold ``up`` with 1, 3, 5 and 7 etcd members (plus one controller),
  5. the floor: the same containers created and etcd started directly (podman run + etcd
     with the same certificates, no Ansible), until ``endpoint health --cluster`` passes.
Per-phase times come from the progress lines ``up -v`` prints per play. Results: a table, a
JSON and a CSV file, a PNG plot of time against member count (ours and the floor), and each
speed target of the run met or missed with its figure and why (``targets.json``).
Every sandbox runs offline (Debian's etcd package, the k0s download on a closed loopback
port) under its own name and subnet, so a sandbox the user has up is not touched.
With SANDBOX_PROFILE=1 each ``up``'s log holds every task's time (profile_tasks, one recap
per playbook) and each cold and warm ``up`` row gets its 10 slowest tasks (``slowest``).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from .topology import REPO_ROOT

OFFLINE_VARS = {"etcd_install_method": "package",
                "k0s_download_base_url": "http://127.0.0.1:9/k0s-releases"}
PHASE_RE = re.compile(r"^==> \[\d+/\d+\] (\w+): .*\(\+(\d+)s\)$", re.MULTILINE)
DONE_RE = re.compile(r"^\s+(\w+) done \(\+(\d+)s\): .*changed=(\d+)", re.MULTILINE)
RECAP_TASK_RE = re.compile(r"^(\S.*?) -+ (\d+\.\d+)s$", re.MULTILINE)
LOG_RE = re.compile(r"full log: (\S+)")


def slowest(log_text: str, count: int = 10) -> list[tuple[str, float]]:
    """The ``count`` slowest tasks of a command's log: profile_tasks' recap lines
    (``role : task ---- 1.23s``) of all its playbooks, slowest first."""
    recaps = log_text.split("TASKS RECAP")[1:]
    found = [(m.group(1).strip(), float(m.group(2)))
             for recap in recaps for m in RECAP_TASK_RE.finditer(recap.split("PLAY RECAP")[0])]
    return sorted(found, key=lambda t: -t[1])[:count]


def _topology(where: Path, name: str, subnet: str, members: int | None) -> Path:
    data = yaml.safe_load((REPO_ROOT / "inventories" / "default.yml").read_text())
    data["name"] = name
    data["networks"] = {"podman": subnet}
    if members is not None:
        data["nodes"] = [{"name": f"etcd-{i}", "groups": ["etcd"], "host": 10 + i}
                         for i in range(1, members + 1)]
        data["nodes"].append({"name": "k0s-1", "groups": ["k0s_controller"], "host": 100})
        data["allow_even_etcd"] = True
    data["vars"] = {**data.get("vars", {}), **OFFLINE_VARS}
    path = where / f"{name}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Bench:
    def __init__(self, out: Path, state: Path) -> None:
        self.out = out
        self.state = state
        self.rows: list[dict[str, Any]] = []

    def sandbox(self, *args: str) -> tuple[float, str]:
        cmd = [sys.executable, str(REPO_ROOT / "scripts" / "sandbox"), *args]
        env = {**os.environ, "SANDBOX_STATE_DIR": str(self.state)}
        t0 = time.monotonic()
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        took = time.monotonic() - t0
        if res.returncode != 0:
            raise RuntimeError(f"sandbox {' '.join(args)} failed ({res.returncode}):\n"
                               f"{res.stdout[-3000:]}\n{res.stderr[-2000:]}")
        return took, res.stdout

    @staticmethod
    def phases(stdout: str) -> dict[str, float]:
        """Seconds per phase (nodes, validate, pki, etcd, lb, k0s, verify) from ``up``."""
        marks = [(m.group(1), int(m.group(2))) for m in PHASE_RE.finditer(stdout)]
        ends = {m.group(1): int(m.group(2)) for m in DONE_RE.finditer(stdout)}
        out: dict[str, float] = {}
        for i, (phase, start) in enumerate(marks):
            nxt = marks[i + 1][1] if i + 1 < len(marks) else ends.get("site", start)
            if phase == "nodes" and i + 1 < len(marks) and marks[i + 1][0] != "nodes":
                nxt = ends.get("nodes", nxt)
            out[phase] = out.get(phase, 0) + max(0, nxt - start)
        return out

    def record(self, case: str, members: int, rep: int, seconds: float, **extra: Any) -> None:
        row = {"case": case, "members": members, "rep": rep, "seconds": round(seconds, 1),
               "load1": round(os.getloadavg()[0], 1), **extra}
        self.rows.append(row)
        print(f"  {case:<10} members={members} rep={rep}: {seconds:6.1f}s load={row['load1']} "
              f"{' '.join(f'{k}={v}' for k, v in extra.items())}", flush=True)


def floor(topo_path: Path, pki: Path, etcd_bin: Path, members: int) -> float:
    """Containers plus etcd started by hand with the same certificates, until healthy.

    Runs after the sandbox is down, on the sandbox's own subnet and member addresses (the
    certificates name them), with its PKI left in place by ``down``."""
    data = yaml.safe_load(topo_path.read_text())
    name = f"{data['name']}-floor"
    net = data["networks"]["podman"]
    base = net.rsplit(".", 1)[0]
    image = subprocess.run([str(REPO_ROOT / "scripts" / "build-image")], capture_output=True,
                           text=True, check=True).stdout.strip()
    addrs = [f"{base}.{10 + i}" for i in range(1, members + 1)]
    cluster = ",".join(f"etcd-{i}=https://{a}:2380" for i, a in enumerate(addrs, 1))
    limits = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
    t0 = time.monotonic()
    try:
        subprocess.run(["podman", "network", "create", "--subnet", f"{base}.0/24", name],
                       check=True, capture_output=True)
        for i, addr in enumerate(addrs, 1):
            pki_args = ["-v", f"{pki}/ca.crt:/pki/ca.crt:ro",
                        "-v", f"{pki}/members/etcd-{i}.crt:/pki/m.crt:ro",
                        "-v", f"{pki}/members/etcd-{i}.key:/pki/m.key:ro"]
            subprocess.run(["podman", "run", "-d", "--name", f"{name}-{i}", "--network", name,
                            "--ip", addr, "--systemd=always", *limits, *pki_args,
                            "-v", f"{etcd_bin}:/opt/etcd:ro", image, "/sbin/init"],
                           check=True, capture_output=True)
        for i, addr in enumerate(addrs, 1):
            tls = ("--cert-file=/pki/m.crt --key-file=/pki/m.key --trusted-ca-file=/pki/ca.crt "
                   "--client-cert-auth --peer-cert-file=/pki/m.crt --peer-key-file=/pki/m.key "
                   "--peer-trusted-ca-file=/pki/ca.crt --peer-client-cert-auth")
            cmd = (f"/opt/etcd/etcd --name etcd-{i} --data-dir /var/lib/etcd-floor "
                   f"--listen-client-urls https://{addr}:2379 --advertise-client-urls "
                   f"https://{addr}:2379 --listen-peer-urls https://{addr}:2380 "
                   f"--initial-advertise-peer-urls https://{addr}:2380 --initial-cluster "
                   f"{cluster} --initial-cluster-state new {tls}")
            subprocess.run(["podman", "exec", "-d", f"{name}-{i}", "sh", "-c",
                            f"exec {cmd} >/var/log/etcd-floor.log 2>&1"], check=True,
                           capture_output=True)
        deadline = time.monotonic() + 120
        while True:
            probe = subprocess.run(
                ["podman", "exec", f"{name}-1", "/opt/etcd/etcdctl", "--endpoints",
                 ",".join(f"https://{a}:2379" for a in addrs), "--cacert", "/pki/ca.crt",
                 "--cert", "/pki/m.crt", "--key", "/pki/m.key", "endpoint", "health"],
                capture_output=True, text=True, check=False)
            if probe.returncode == 0:
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                raise RuntimeError(f"floor: etcd not healthy in 120 s: {probe.stderr[-500:]}")
            time.sleep(0.2)
    finally:
        for i in range(1, members + 1):
            subprocess.run(["podman", "rm", "-f", "-t", "0", f"{name}-{i}"], capture_output=True,
                           check=False)
        subprocess.run(["podman", "network", "rm", "-f", name], capture_output=True, check=False)


def debian_etcd(cache: Path) -> Path:
    """etcd and etcdctl from Debian's packages (apt-get download; no install), for the floor."""
    target = cache / "debian-etcd"
    if (target / "etcd").is_file() and (target / "etcdctl").is_file():
        return target
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", "etcd-server", "etcd-client"], cwd=tmp, check=True,
                       capture_output=True)
        for deb in Path(tmp).glob("*.deb"):
            subprocess.run(["dpkg-deb", "-x", str(deb), f"{tmp}/root"], check=True)
        for tool in ("etcd", "etcdctl"):
            shutil.copy2(f"{tmp}/root/usr/bin/{tool}", target / tool)
    return target


def median(rows: list[dict[str, Any]], case: str, members: int) -> float | None:
    vals = [r["seconds"] for r in rows if r["case"] == case and r["members"] == members]
    return round(statistics.median(vals), 1) if vals else None


# Issue 38's targets (idle machine, one run; ratios to the floor of the same run; issue 31's
# were 30 s and a 3 s no-op). The clean-clone CI time and `scripts/test --quick` are the other
# two; bench cannot measure them (scripts/test prints its wall time).
COLD_LIMIT, COLD_FLOOR_RATIO, NOOP_LIMIT, MEMBERS_RATIO, DOWN_LIMIT = 25.0, 20.0, 1.0, 1.3, 3.0
NOT_PHASES = {"case", "members", "rep", "seconds", "load1", "slowest", "changed"}


def phase_medians(rows: list[dict[str, Any]], case: str, members: int) -> dict[str, float]:
    """Each phase's median seconds over the rows of a case and member count."""
    picked = [r for r in rows if r["case"] == case and r["members"] == members]
    names = {k for r in picked for k, v in r.items()
             if k not in NOT_PHASES and isinstance(v, int | float)}
    return {k: statistics.median([r.get(k, 0) for r in picked]) for k in names}


def _largest(phases: dict[str, float], count: int = 3) -> str:
    top = sorted(phases.items(), key=lambda kv: (-kv[1], kv[0]))[:count]
    return ", ".join(f"{k} {v:g} s" for k, v in top if v > 0)


def targets(rows: list[dict[str, Any]], cores: int | None = None) -> list[dict[str, Any]]:
    """Each target of the run: what it is, the figure, met or not, and why (from the phases
    and the slowest tasks the run recorded). A target whose cases did not run is left out."""
    cores = cores or os.cpu_count() or 1
    out: list[dict[str, Any]] = []

    def add(target: str, figure: str, met: bool, why: str) -> None:
        out.append({"target": target, "figure": figure, "met": met, "reason": "" if met else why})

    cold, fl = median(rows, "cold-up", 3), median(rows, "floor", 3)
    phases = phase_medians(rows, "cold-up", 3)
    if cold is not None:
        slow = next((r["slowest"] for r in rows if r["case"] == "cold-up" and "slowest" in r), "")
        slow = "; ".join(slow.split("; ")[:3])
        add(f"cold up of the default topology <= {COLD_LIMIT:g} s", f"{cold:g} s",
            cold <= COLD_LIMIT, f"largest phases: {_largest(phases)}"
            + (f"; slowest tasks: {slow}" if slow else ""))
        if fl:
            extra = {k: v for k, v in phases.items() if k not in ("nodes", "etcd")}
            add(f"cold up <= {COLD_FLOOR_RATIO:g} x floor", f"{cold / fl:.1f} x ({fl:g} s)",
                cold / fl <= COLD_FLOOR_RATIO,
                f"the floor starts containers and etcd only; {sum(extra.values()):g} s of the up "
                f"are phases it does not have ({_largest(extra, 5)})")
    seven = median(rows, "cold-up", 7)
    if seven is not None and cold:
        grow = {k: v - phases.get(k, 0) for k, v in phase_medians(rows, "cold-up", 7).items()}
        add(f"cold up, 7 members <= {MEMBERS_RATIO:g} x 3 members", f"{seven / cold:.2f} x "
            f"({seven:g} s / {cold:g} s)", seven / cold <= MEMBERS_RATIO,
            f"4 more nodes' tasks run on the control node's {cores} core(s): "
            f"{_largest({k: v for k, v in grow.items() if v > 0}, 4).replace(' s', ' s more')}")
    for case, label, limit, why in (
            ("noop-up", "no-op up", NOOP_LIMIT,
             "the check: one podman ps, one ssh per node, each member's /health"),
            ("down", "down", DOWN_LIMIT, "podman rm of every node and the network")):
        took = median(rows, case, 3)
        if took is not None:
            add(f"{label} <= {limit:g} s", f"{took:g} s", took <= limit, why)
    return out


def print_targets(found: list[dict[str, Any]], load: float, cores: int) -> None:
    """The verdicts; ``load`` is the host's before the bench started its own work."""
    idle = load <= cores / 2
    print(f"\n  targets (load {load:g} on {cores} cores before the bench: "
          f"{'idle' if idle else 'NOT idle: the targets are for an idle machine'}):")
    for t in found:
        verdict = "met   " if t["met"] else "MISSED"
        print(f"  {verdict} {t['target']}: {t['figure']}"
              + (f" -- {t['reason']}" if t["reason"] else ""))
    print("  (not measured here) clean-clone .ci/run <= 25 min and scripts/test --quick <= 3 min:"
          " scripts/test prints its wall time")


def plot(rows: list[dict[str, Any]], counts: list[int], path: Path) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (.venv/bin/pip install matplotlib)"
    fig, ax = plt.subplots(figsize=(6, 4))
    for case, label in (("cold-up", "scripts/sandbox up (cold)"), ("floor", "floor (no Ansible)")):
        ys = [median(rows, case, n) for n in counts]
        pts = [(n, y) for n, y in zip(counts, ys, strict=True) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xlabel("etcd members (+1 controller)")
    ax.set_ylabel("seconds (median)")
    ax.set_xticks(counts)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title("Cold sandbox up vs. floor")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return f"plot: {path}"


def profiled(stdout: str) -> dict[str, Any]:
    """With SANDBOX_PROFILE=1: ``slowest``, the up's 10 slowest tasks ('task=1.2s; ...')."""
    log = LOG_RE.search(stdout)
    if os.environ.get("SANDBOX_PROFILE") != "1" or not log:
        return {}
    text = (REPO_ROOT / log.group(1)).read_text(errors="replace")
    return {"slowest": "; ".join(f"{name}={secs:.1f}s" for name, secs in slowest(text))}


def _measure(bench: Bench, work: Path, reps: int, counts: list[int], etcd_bin: Path | None,
             with_floor: bool) -> None:
    default = _topology(work, "bench-default", "10.213.150.0/24", None)
    t = ["--topology", str(default)]
    for rep in range(1, reps + 1):
        took, stdout = bench.sandbox("up", "-v", *t)
        bench.record("cold-up", 3, rep, took, **bench.phases(stdout), **profiled(stdout))
        took, stdout = bench.sandbox("up", "--force", "-v", *t)
        changed = sum(int(m.group(3)) for m in DONE_RE.finditer(stdout))
        bench.record("warm-up", 3, rep, took, changed=changed, **bench.phases(stdout),
                     **profiled(stdout))
        took, stdout = bench.sandbox("up", *t)
        if "nothing to change" not in stdout:
            raise RuntimeError(f"a no-op up converged:\n{stdout}")
        bench.record("noop-up", 3, rep, took)
        took, _ = bench.sandbox("down", "--purge", *t)
        bench.record("down", 3, rep, took)
    for n in counts:
        topo = _topology(work, f"bench-m{n}", f"10.213.{150 + n}.0/24", n)
        t = ["--topology", str(topo)]
        for rep in range(1, reps + 1):
            took, stdout = bench.sandbox("up", "-v", *t)
            bench.record("cold-up", n, rep, took, **bench.phases(stdout))
            bench.sandbox("down", *t)  # keeps the PKI for the floor
            if with_floor and etcd_bin is not None:
                pki = work / "state" / f"bench-m{n}" / "pki"
                bench.record("floor", n, rep, floor(topo, pki, etcd_bin, n))
            bench.sandbox("down", "--purge", *t)


def run(reps: int, counts: list[int], out: Path, with_floor: bool) -> int:
    load_before = round(os.getloadavg()[0], 1)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sandbox-bench-"))
    bench = Bench(out, work / "state")
    print(f"bench: {reps} repetition(s); member counts {counts}; results in {out}", flush=True)
    subprocess.run([str(REPO_ROOT / "scripts" / "build-image")], check=True, capture_output=True)
    etcd_bin = debian_etcd(REPO_ROOT / ".cache") if with_floor else None
    try:
        _measure(bench, work, reps, counts, etcd_bin, with_floor)
    except BaseException:  # a failed step leaves no bench sandbox behind
        for topo in sorted(work.glob("bench-*.yml")):
            try:
                bench.sandbox("down", "--purge", "--topology", str(topo))
            except RuntimeError as exc:
                print(f"bench: cleanup of {topo.stem} failed: {exc}", file=sys.stderr)
        shutil.rmtree(work, ignore_errors=True)
        raise
    (out / "bench.json").write_text(json.dumps(bench.rows, indent=2) + "\n")
    keys = sorted({k for r in bench.rows for k in r})
    with open(out / "bench.csv", "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(bench.rows)
    print("\n  case        members  median s   floor s   ratio")
    for case in ("cold-up", "warm-up", "noop-up", "down"):
        for n in sorted({r["members"] for r in bench.rows if r["case"] == case}):
            m, f = median(bench.rows, case, n), median(bench.rows, "floor", n)
            ratio = f"{m / f:5.1f}x" if (case == "cold-up" and m and f) else ""
            print(f"  {case:<10} {n:>8} {m:>10} {f if case == 'cold-up' and f else '':>9} {ratio:>7}")
    found = targets(bench.rows)
    (out / "targets.json").write_text(json.dumps(found, indent=2) + "\n")
    cores = os.cpu_count() or 1
    print_targets(found, load_before, cores)
    print(plot(bench.rows, counts, out / "bench.png"))
    print(f"files: {out / 'bench.json'}, {out / 'bench.csv'}, {out / 'targets.json'}")
    shutil.rmtree(work, ignore_errors=True)
    return 0
