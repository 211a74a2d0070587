"""The tenant_migrate scenario's load and its findings (issue 40's done-when), test code.

``move.py run -t TOPOLOGY --result FILE``: the Widget CRD and MOVE_OBJECTS widgets (200 by
default) created through tenant-a's API server (the CRD API server stand-in, NOT k0s) with
the kubeconfig `up` wrote; the neighbours' keys and mod revisions read (tenant-b on main,
tenant-c on second). Then a move dropped: `migrate --copy-only` (the copy on second while
tenant-a serves), its API server stopped by hand as an interrupted freeze leaves it, `up`
refused meanwhile, `migrate --abort` (the copy, the user and role leave second; the API
server serves again on main). Then a client creates widgets one at a time while
`scripts/sandbox migrate --tenant tenant-a --to second` runs as typed, and goes on until it
has an acknowledged write after the command ended. Last, `up` on the edited topology (which
converges: the file changed) and the tasks it changed, from its log. Everything seen goes to
FILE.

``move.py check --result FILE -t TOPOLOGY``: what the move must have kept, as JSON for
verify.yml's asserts: acknowledged objects missing or with another uid, objects whose
resourceVersion went back, the list's version below one seen, the neighbours' keys changed,
tenant-a's keys left on main, the dropped move's traces; and the figures (the freeze the command printed, the client's
longest wait between two acknowledged writes).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from test_tenant_migrate_api import Client, https_call, widget

NEIGHBOURS = (("main", "/tenant-b/"), ("second", "/tenant-c/"))
# What `up` after a move may change: the control node's record of the inputs the stand-in's
# PKI was made from (per cluster's view: the tenant changed views) and each node's record of
# what it was converged to (the CLI's own, for its next no-op check). Nothing else.
RECORDS = ("k0sbox.external_etcd.crd_apiserver : Record the inputs the PKI was made from",
           "Record the inputs and the live state of what the roles manage")


class KubeconfigApi:
    """A tenant's Kubernetes API (the CRD API server stand-in, not k0s) through the
    kubeconfig `up` wrote; the cluster-scoped widgets of docs/examples/crd.yaml."""

    def __init__(self, kubeconfig: Path, tmp: Path) -> None:
        conf = yaml.safe_load(kubeconfig.read_text())
        user, cluster = conf["users"][0]["user"], conf["clusters"][0]["cluster"]
        for field, file in (("client-certificate-data", "c.crt"), ("client-key-data", "c.key"),
                            ("certificate-authority-data", "ca.crt")):
            data = user.get(field) or cluster.get(field)
            (tmp / file).write_bytes(base64.b64decode(data))
        self.url = cluster["server"]
        self.ctx = ssl.create_default_context(cafile=str(tmp / "ca.crt"))
        self.ctx.load_cert_chain(str(tmp / "c.crt"), str(tmp / "c.key"))

    def call(self, method: str, path: str, body: Any = None,
             timeout: float = 10) -> tuple[int, Any]:
        return https_call(self.url, self.ctx, method, path, body, timeout)

    @staticmethod
    def widgets() -> str:
        return "/apis/example.sandbox/v1/widgets"


def sandbox(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """scripts/sandbox as typed, in the repository root (the scenario's SANDBOX_STATE_DIR)."""
    return subprocess.run([str(ROOT / "scripts" / "sandbox"), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, check=False)


def must(res: subprocess.CompletedProcess[str]) -> str:
    if res.returncode != 0:
        sys.exit(f"{' '.join(res.args)}: exit {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res.stdout


def prefix_revisions(topo: Path, cluster: str, prefix: str) -> dict[str, int]:
    """Every key under ``prefix`` on ``cluster`` with its mod revision (admin, etcdctl)."""
    out = must(sandbox(["etcdctl", "--cluster", cluster, "-t", str(topo), "get", prefix,
                        "--prefix", "-w", "json"], 120))
    return {base64.b64decode(kv["key"]).decode(): int(kv["mod_revision"])
            for kv in json.loads(out).get("kvs", [])}


def objects(items: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {o["metadata"]["name"]: [o["metadata"]["uid"], int(o["metadata"]["resourceVersion"])]
            for o in items}


def tenant_api(topo: Path, state: Path, tenant: str, tmp: Path) -> KubeconfigApi:
    """The tenant's API with the example CRD applied (`scripts/sandbox kubectl`) and served."""
    must(sandbox(["kubectl", "-t", str(topo), "--tenant", tenant, "apply", "-f",
                  "docs/examples/crd.yaml"], 120))
    (tmp / tenant).mkdir()
    api = KubeconfigApi(state / "kubeconfig" / f"{tenant}.yaml", tmp / tenant)
    deadline = time.monotonic() + 60
    while api.call("GET", api.widgets())[0] != 200:
        if time.monotonic() > deadline:
            sys.exit(f"{tenant}: the Widget CRD was not served in 60 s")
        time.sleep(0.2)
    return api


def run(topo: Path, result: Path, count: int) -> None:
    name = yaml.safe_load(topo.read_text())["name"]
    state = Path(os.environ.get("SANDBOX_STATE_DIR") or ROOT / ".sandbox") / name
    with tempfile.TemporaryDirectory() as tmp:
        # the neighbours hold objects of their own, whose keys must not move
        for neighbour in ("tenant-b", "tenant-c"):
            other = tenant_api(topo, state, neighbour, Path(tmp))
            for i in range(20):
                if other.call("POST", other.widgets(), widget(f"{neighbour}-{i:02d}", i))[0] != 201:
                    sys.exit(f"{neighbour}: widget {i} not created")
        api = tenant_api(topo, state, "tenant-a", Path(tmp))
        failed: list[str] = []

        def make(part: int) -> None:    # four writers: the API server batches them
            for i in range(part, count, 4):
                if api.call("POST", api.widgets(), widget(f"pre-{i:05d}", i), 30)[0] != 201:
                    failed.append(f"pre-{i:05d}")
        makers = [threading.Thread(target=make, args=(p,)) for p in range(4)]
        t0 = time.monotonic()
        for t in makers:
            t.start()
        for t in makers:
            t.join()
        if failed:
            sys.exit(f"{len(failed)} widgets not created: {failed[:5]}")
        code, before = api.call("GET", api.widgets(), timeout=120)
        print(f"{count} widgets created through tenant-a's API server in "
              f"{time.monotonic() - t0:.0f}s", flush=True)
        neighbours = {c: prefix_revisions(topo, c, p) for c, p in NEIGHBOURS}
        dropped = drop_a_move(topo, name, api)
        print(dropped["copy_only"]["stdout"] + dropped["abort"]["stdout"], flush=True)
        client = Client(api)
        client.start()
        try:
            while len(client.acked) < 10:
                time.sleep(0.05)
            t_move = time.monotonic()
            moved = sandbox(["migrate", "-t", str(topo), "--tenant", "tenant-a", "--to",
                             "second"])
            t_done = time.monotonic()
            deadline = t_done + 60
            while not [a for a in client.acked if a[0] > t_done] and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            client.stop.set()
            client.join()
        code_after, after = api.call("GET", api.widgets(), timeout=120)
    up = sandbox(["up", "-t", str(topo)], 1800)
    result.write_text(json.dumps({
        "up_after": {"rc": up.returncode, "stdout": up.stdout, "stderr": up.stderr,
                     "changed": changed_tasks(up.stdout)},
        "objects": count, "migrate": {"rc": moved.returncode, "stdout": moved.stdout,
                                      "stderr": moved.stderr},
        "t_move": t_move, "t_done": t_done, "acked": client.acked, "failed": client.failed,
        "before": objects(before["items"]) if code == 200 else None,
        "after": objects(after["items"]) if code_after == 200 else None,
        "after_version": int(after["metadata"]["resourceVersion"]) if code_after == 200 else 0,
        "neighbours": neighbours, "dropped": dropped}, indent=1))
    print(moved.stdout + moved.stderr)
    if moved.returncode != 0:
        sys.exit(f"migrate: exit {moved.returncode}")


def changed_tasks(stdout: str) -> list[str]:
    """'task name [host]' of each change in the full log a command named ('full log: ...')."""
    named = re.search(r"full log: (\S+)", stdout)
    if not named:
        return ["(no full log named)"]
    log = Path(named.group(1))
    task, found = "", []
    for line in (log if log.is_absolute() else ROOT / log).read_text().splitlines():
        if line.startswith("TASK ["):
            task = line[6:].split("] ")[0].rstrip("]")
        elif line.startswith("changed: ["):
            found.append(f"{task} [{line[10:].split(']')[0]}]")
    return found


def users(topo: Path, cluster: str) -> list[str]:
    return must(sandbox(["etcdctl", "--cluster", cluster, "-t", str(topo), "user", "list"],
                        120)).split()


def drop_a_move(topo: Path, name: str, api: KubeconfigApi) -> dict[str, Any]:
    """`migrate --copy-only`, tenant-a's API server stopped as an interrupted freeze leaves
    it, `up` refused, `migrate --abort`: what each step left."""
    line = ["migrate", "-t", str(topo), "--tenant", "tenant-a", "--to", "second"]
    out: dict[str, Any] = {}
    copy = sandbox([*line, "--copy-only"])
    out["copy_only"] = {"rc": copy.returncode, "stdout": copy.stdout, "stderr": copy.stderr}
    out["copied_keys"] = len(prefix_revisions(topo, "second", "/tenant-a/"))
    out["users_second_copied"] = users(topo, "second")
    stop = subprocess.run(["podman", "exec", f"k0sbox-{name}-mig-ctrl-a", "systemctl", "stop",
                           "crd-apiserver"], capture_output=True, text=True, check=False)
    out["stopped"] = stop.returncode == 0
    try:
        out["api_while_stopped"] = api.call("GET", api.widgets(), timeout=5)[0]
    except OSError:
        out["api_while_stopped"] = 0
    up = sandbox(["up", "-t", str(topo)], 120)
    out["up"] = {"rc": up.returncode, "stderr": up.stderr}
    abort = sandbox([*line, "--abort"])
    out["abort"] = {"rc": abort.returncode, "stdout": abort.stdout, "stderr": abort.stderr}
    code, after = api.call("GET", api.widgets(), timeout=60)
    out["after_abort"] = objects(after["items"]) if code == 200 else None
    out["left_on_second"] = len(prefix_revisions(topo, "second", "/tenant-a/"))
    out["users_second_dropped"] = users(topo, "second")
    return out


def check(topo: Path, result: Path) -> dict[str, Any]:
    got = json.loads(result.read_text())
    acked = sorted(got["acked"], key=lambda a: a[4])
    after, before = got["after"] or {}, got["before"] or {}
    t_move, t_done = got["t_move"], got["t_done"]
    waits = [b[4] - a[4] for a, b in itertools.pairwise(acked) if t_move <= b[4] <= t_done + 60]
    freeze = re.search(r"freeze: its API servers stopped for ([\d.]+)s", got["migrate"]["stdout"])
    # on the source: every object listed before the move and each acknowledged before it began
    on_source = {n: v for n, (_, v) in before.items()}
    on_source.update({n: v for sent, n, _, v, _ in acked if sent < t_move})
    seen = [a[3] for a in acked] + list(on_source.values())
    dropped, up = got["dropped"], got["up_after"]
    return {
        "up_after": {"rc": up["rc"], "changed": up["changed"],
                     "changed_beyond_records": [c for c in up["changed"]
                                                if not c.startswith(RECORDS)],
                     "quick_checks": len(re.findall(r"etcd cluster '\w+': quick check passed",
                                                    up["stdout"]))},
        "dropped": {
            "copy_only_rc": dropped["copy_only"]["rc"],
            "copy_only_said": "still runs on main" in dropped["copy_only"]["stdout"],
            "copied_keys": dropped["copied_keys"],
            "copied_user": "tenant-a" in dropped["users_second_copied"],
            "stopped": dropped["stopped"], "api_while_stopped": dropped["api_while_stopped"],
            "up_rc": dropped["up"]["rc"],
            "up_said": "--to second --abort" in dropped["up"]["stderr"],
            "abort_rc": dropped["abort"]["rc"],
            "abort_said": "dropped: it runs on main as before" in dropped["abort"]["stdout"],
            "objects_after_abort": dropped["after_abort"] == before,
            "left_on_second": dropped["left_on_second"],
            "user_left_on_second": "tenant-a" in dropped["users_second_dropped"],
        },
        "objects": got["objects"], "acknowledged_during": len(acked),
        "failed_attempts": got["failed"], "migrate_rc": got["migrate"]["rc"],
        "moved_line": "sandbox: tenant tenant-a moved from etcd cluster main to second"
                      in got["migrate"]["stdout"],
        "freeze_printed": float(freeze.group(1)) if freeze else None,
        "longest_wait": round(max(waits), 2) if waits else None,
        "after_listed": bool(got["after"]),
        "before_listed": len(before),
        "written_after_the_move": sum(a[0] > t_done for a in acked),
        # every acknowledged object there with its uid (made before the move or during it)
        "missing": [n for _, n, uid, _, _ in acked if after.get(n, [None])[0] != uid]
                   + [n for n, (uid, _) in before.items() if after.get(n, [None])[0] != uid],
        # no version goes back: each at or above the one acknowledged for it, strictly above
        # for those written on the source (their keys were rewritten on the target)
        "went_back": [n for _, n, _, v, _ in acked if n in after and after[n][1] < v],
        "not_above_source": [n for n, v in on_source.items() if n in after and after[n][1] <= v],
        "list_below_seen": got["after_version"] < max(seen) if seen else True,
        "neighbours_changed": [p for c, p in NEIGHBOURS
                               if prefix_revisions(topo, c, p) != got["neighbours"][c]],
        "neighbour_keys": {p: len(got["neighbours"][c]) for c, p in NEIGHBOURS},
        "left_on_main": sorted(prefix_revisions(topo, "main", "/tenant-a/")),
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="move.py", description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=("run", "check"))
    p.add_argument("-t", "--topology", type=Path, required=True)
    p.add_argument("--result", type=Path, required=True)
    args = p.parse_args()
    if args.step == "run":
        run(args.topology, args.result, int(os.environ.get("MOVE_OBJECTS", "200")))
    else:
        print(json.dumps(check(args.topology, args.result)))


if __name__ == "__main__":
    main()
