"""Issue 38, "A no-op must never hide drift", as a user meets it: a systemd drop-in added by
hand to a member's etcd unit (daemon-reload, etcd restarted: the process runs with it).

On the `single` topology's member alone (sandbox h38-drift, podman subnet 10.213.105.0/24):
`up`; the drop-in by hand; `verify` fails naming the member, the unit and the drop-in; the
next `up` does not say "nothing to change", names it, removes it and restarts etcd (the
etcd role's rolling restart); `verify` passes and the process no longer has the variable;
a further `up` is the no-op again; `down` leaves no podman object."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import REPO_ROOT, explain, podman_objects, podman_usable, run_sandbox

NAME = "h38-drift"
SUBNET = "10.213.105.0/24"
MEMBER = f"k0sbox-{NAME}-etcd-1"
DROPIN = "/etc/systemd/system/etcd.service.d/x.conf"
BY_HAND = (f"mkdir -p {Path(DROPIN).parent} && printf '[Service]\\nEnvironment=ETCD_ENABLE_PPROF=true\\n'"
           f" > {DROPIN} && systemctl daemon-reload && systemctl restart etcd")
# etcd's environment, read as its user (root in the container has no CAP_SYS_PTRACE)
ENVIRON = ("setpriv --reuid etcd --regid etcd --clear-groups "
           "cat /proc/$(systemctl show -p MainPID --value etcd)/environ | tr '\\0' '\\n'")


def on_member(command: str) -> str:
    done = subprocess.run(["podman", "exec", MEMBER, "sh", "-c", command], capture_output=True,
                          text=True, check=True, timeout=120)
    return done.stdout


@pytest.mark.e2e
def test_a_drop_in_added_by_hand_is_found_by_verify_and_removed_by_up(tmp_path: Path) -> None:
    reason = podman_usable()
    if reason:
        pytest.skip(f"whole-sandbox test needs podman: {reason}")
    # the shipped `single` topology's member alone, offline as the other whole-sandbox tests
    data = yaml.safe_load((REPO_ROOT / "inventories" / "single.yml").read_text())
    del data["tenants"]
    data.update(name=NAME, description="single's etcd member alone", networks={"podman": SUBNET},
                nodes=[n for n in data["nodes"] if "etcd" in n["groups"]],
                vars={"etcd_install_method": "package",
                      "k0s_download_base_url": "http://127.0.0.1:9/k0s-releases"})
    path = tmp_path / f"{NAME}.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    state = tmp_path / "state"
    topo = ["--topology", str(path)]
    try:
        up = run_sandbox(["up", *topo], state, timeout=900)
        assert up.returncode == 0, explain(up)
        on_member(BY_HAND)
        assert "ETCD_ENABLE_PPROF=true" in on_member(ENVIRON).split()

        verify = run_sandbox(["verify", *topo], state, timeout=600)
        assert verify.returncode != 0, explain(verify)
        report = json.loads((state / NAME / "verify.json").read_text())
        failed = [c for c in report["checks"] if not c["ok"]]
        assert [c["name"].split(" runs ")[0] for c in failed] == ["etcd-1: etcd"], failed
        assert f"etcd.service: drop-in {DROPIN} is not the roles' " \
               "(Environment=ETCD_ENABLE_PPROF=true)" in failed[0]["detail"], failed
        assert "etcd-1: etcd runs as its role gives it" in verify.stderr + verify.stdout

        again = run_sandbox(["up", *topo], state, timeout=900)
        assert again.returncode == 0, explain(again)
        assert "nothing to change" not in again.stdout, again.stdout
        assert f"etcd-1: etcd.service: drop-in {DROPIN} is not the roles'" in again.stdout
        assert f"WARNING: etcd-1: removed {DROPIN}, a drop-in no role wrote" in again.stdout, \
            again.stdout
        assert on_member(f"test -e {DROPIN} && echo there || echo gone").strip() == "gone"
        assert not [v for v in on_member(ENVIRON).split() if v.startswith("ETCD_ENABLE_PPROF")]

        verify = run_sandbox(["verify", *topo], state, timeout=600)
        assert verify.returncode == 0, explain(verify)
        noop = run_sandbox(["up", *topo], state, timeout=120)
        assert noop.returncode == 0 and "nothing to change" in noop.stdout, explain(noop)
    finally:
        down = run_sandbox(["down", *topo], state, timeout=300)
        assert down.returncode == 0, explain(down)
        assert podman_objects(NAME) == []
