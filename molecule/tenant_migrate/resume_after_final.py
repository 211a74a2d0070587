"""By hand, not in CI: a move resumed after an interrupted freeze whose final step ran.

``SANDBOX_STATE_DIR=<dir> python molecule/tenant_migrate/resume_after_final.py TOPOLOGY``
on a sandbox `up` from a copy of this scenario's topology.yml (tenant-a on main): 50 widgets
through tenant-a's API (the CRD API server stand-in, NOT k0s); `migrate --copy-only`; the
stand-in stopped and the engine's final step run alone (an ansible-playbook of
k0s_controller's tenant_migrate, step final): what a freeze cut between `final` and the
start leaves (the receipt on the target, k0s.yaml still naming the source); then a client
writes through tenant-a's API while `migrate --tenant tenant-a --to second` resumes. Prints
the acknowledged writes and those not on the target afterwards; exit 1 if any is missing.
``MIGRATE_ROOT`` runs the resuming `migrate` from another checkout (a commit before the fix).

Measured 2026-12-07 (docs/day2.md, "Move a tenant to another etcd cluster"): before the fix
(the move phase ran the whole crd_apiserver role before the freeze, which started the stopped
stand-in on the source) 50 of 350 acknowledged writes were lost; after it none (275, 207 and 242 in three runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from move import must, objects, sandbox, tenant_api
from test_tenant_migrate_api import widget

FINAL = """- name: The engine's final step alone (a freeze cut after final)
  hosts: tenant_tenant_a
  gather_facts: false
  tasks:
    - name: Final
      ansible.builtin.include_role: {name: k0sbox.external_etcd.k0s_controller, tasks_from: tenant_migrate}
      vars: {k0s_migrate_step: final, k0s_migrate_tenant: tenant-a, k0s_migrate_target_group: etcd_cluster_second}
"""


def main(topo: str) -> int:
    state = Path(os.environ["SANDBOX_STATE_DIR"]) / "m-migrate"
    tmp = Path(tempfile.mkdtemp(prefix="resume-after-final-"))
    api = tenant_api(Path(topo), state, "tenant-a", tmp)
    for i in range(50):
        code, _ = api.call("POST", api.widgets(), widget(f"before-{i}", i))
        assert code == 201, code
    must(sandbox(["migrate", "-t", topo, "--tenant", "tenant-a", "--to", "second", "--copy-only"]))
    subprocess.run(["podman", "exec", "k0sbox-m-migrate-mig-ctrl-a", "systemctl", "stop",
                    "crd-apiserver"], check=True)
    (tmp / "final.yml").write_text(FINAL)
    env = {**os.environ, "SANDBOX_CLUSTER": "main",
           "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    must(subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", topo,
                         str(tmp / "final.yml")], cwd=ROOT, env=env, capture_output=True,
                        text=True, check=False))
    acked: dict[str, str] = {}
    stop = threading.Event()

    def client() -> None:
        for n in range(1_000_000):
            if stop.is_set():
                return
            try:
                code, body = api.call("POST", api.widgets(), widget(f"during-{n}", n), timeout=3)
            except OSError:
                code, body = 0, None
            if code == 201:
                acked[f"during-{n}"] = body["metadata"]["uid"]
            time.sleep(0.05)

    writer = threading.Thread(target=client)
    writer.start()
    root = Path(os.environ.get("MIGRATE_ROOT") or ROOT)
    moved = subprocess.run([str(root / "scripts" / "sandbox"), "migrate", "-t", topo, "--tenant",
                            "tenant-a", "--to", "second"], cwd=root, capture_output=True,
                           text=True, check=False)
    deadline = time.monotonic() + 30   # a few writes after the move, then the check
    while len(acked) < 20 and time.monotonic() < deadline:
        time.sleep(0.2)
    stop.set()
    writer.join()
    print(moved.stdout, moved.stderr)
    code, after = api.call("GET", api.widgets())
    have = objects(after["items"]) if code == 200 else {}
    lost = sorted(n for n, uid in acked.items() if n not in have or have[n][0] != uid)
    print(f"migrate exit {moved.returncode}; {len(acked)} writes acknowledged while it resumed "
          f"and after; not on the target afterwards: {len(lost)} {lost[:10]}")
    return 1 if lost or moved.returncode else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
