"""plugins/modules/sandbox_etcd.py: the etcd operations every caller shares.

Its functions on etcdctl's own JSON (as etcd 3.5 prints it), then the module run by Ansible
against a real three-member etcd cluster on loopback (etcd and etcdctl from the pinned
Debian packages of roles/etcd, scripts/fetch-etcd-debs): who leads, leadership moved to the
preferred member, health with a member stopped, hashkv at one revision under writes, and a
learner promoted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import free_ports, load_plugin, run_module

REPO = Path(__file__).resolve().parents[1]
ANSIBLE = Path(sys.executable).parent / "ansible"


etcd_mod = load_plugin("plugins/modules/sandbox_etcd.py")

# etcdctl 3.5's answers for a cluster of three, e1 leading (IDs as etcd prints them).
STATUS = [
    {"Endpoint": f"https://10.0.0.1{i}:2379",
     "Status": {"header": {"cluster_id": 99, "member_id": mid, "revision": rev, "raft_term": 2},
                "version": ver, "dbSize": 20480 * i, "leader": 11, "raftIndex": 40}}
    for i, (mid, rev, ver) in enumerate([(11, 40, "3.5.30"), (12, 39, "3.4.23"),
                                         (13, 40, "3.5.30")], start=1)]
MEMBERS = [{"ID": mid, "name": f"e{i}", "peerURLs": [f"https://10.0.0.1{i}:2380"],
            "clientURLs": [f"https://10.0.0.1{i}:2379"]}
           for i, mid in enumerate([11, 12, 13], start=1)]


def test_member_view_joins_status_and_member_list() -> None:
    view = etcd_mod.member_view(STATUS, MEMBERS)
    assert [m["name"] for m in view] == ["e1", "e2", "e3"]
    assert [m["id"] for m in view] == ["b", "c", "d"]
    assert [m["leader"] for m in view] == [True, False, False]
    assert view[1]["version"] == "3.4.23" and view[1]["revision"] == 39
    assert etcd_mod.leader_of(view)["name"] == "e1"
    assert etcd_mod.leader_last(view) == ["e2", "e3", "e1"]


def test_a_member_that_did_not_answer_is_listed_without_status() -> None:
    learner = {"ID": 14, "peerURLs": ["https://10.0.0.14:2380"], "isLearner": True}
    view = etcd_mod.member_view(STATUS[1:], [*MEMBERS, learner])
    assert view[0] == {**view[0], "answered": False, "leader": False, "version": ""}
    assert view[3]["name"] == "" and view[3]["learner"] and view[3]["endpoint"] == ""
    # no member says it leads: e1, the leader, did not answer
    assert etcd_mod.leader_of(view) == {}


def test_move_target_prefers_the_named_member_then_the_version() -> None:
    view = etcd_mod.member_view(STATUS, MEMBERS)
    assert etcd_mod.move_target(view, "e1", ["e3", "e2"])["name"] == "e3"
    assert etcd_mod.move_target(view, "e1", ["e1", "nobody"])["name"] == "e2"
    assert etcd_mod.move_target(view, "e1", [], "3.5.30")["name"] == "e3"
    assert etcd_mod.move_target(view, "e1", [], "3.6.0")["name"] == "e2"
    # not to a member that did not answer
    silent = etcd_mod.member_view(STATUS[:1], MEMBERS)
    assert etcd_mod.move_target(silent, "e1", ["e2"]) == {}


def _hashkv(*pairs: tuple[int, int]) -> list[dict[str, Any]]:
    return [{"Endpoint": f"e{i}", "HashKV": {"hash": h, "compact_revision": c}}
            for i, (h, c) in enumerate(pairs)]


def test_hashes_agree_needs_every_member_one_hash_and_one_compaction() -> None:
    assert etcd_mod.hashes_agree(_hashkv((5, 1), (5, 1), (5, 1)), 3)[0]
    assert not etcd_mod.hashes_agree(_hashkv((5, 1), (5, 1)), 3)[0]          # one silent
    assert not etcd_mod.hashes_agree(_hashkv((5, 1), (6, 1), (5, 1)), 3)[0]  # data differs
    ok, detail = etcd_mod.hashes_agree(_hashkv((5, 1), (7, 2), (5, 1)), 3)
    assert not ok and "2 distinct hash(es)" in detail and "compact revision(s) 1, 2" in detail
    assert not etcd_mod.hashes_agree([], 0)[0]


def test_parse_json_tolerates_what_etcdctl_prints_on_failure() -> None:
    assert etcd_mod.parse_json("", []) == []
    assert etcd_mod.parse_json("Error: context deadline exceeded", {}) == {}
    assert etcd_mod.parse_json(json.dumps(STATUS), []) == STATUS


# -- the module on a real cluster ------------------------------------------------------------


def _etcd_binaries(tmp: Path) -> Path:
    """etcd and etcdctl of roles/etcd's pinned packages, unpacked (no install)."""
    if not shutil.which("dpkg-deb"):
        pytest.skip("dpkg-deb not available: the etcd .deb files cannot be unpacked here")
    res = subprocess.run([str(REPO / "scripts" / "fetch-etcd-debs")], capture_output=True,
                         text=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"the pinned etcd packages cannot be had: {res.stderr.strip()[-300:]}")
    root = tmp / "root"
    for deb in res.stdout.split():
        subprocess.run(["dpkg-deb", "-x", deb, str(root)], check=True)
    return root / "usr" / "bin"


class Cluster:
    """Plain-HTTP etcd members on loopback, each its own data dir and ports."""

    def __init__(self, tmp: Path, bindir: Path, names: list[str]) -> None:
        self.tmp, self.bindir, self.procs = tmp, bindir, {}
        ports = free_ports(2 * len(names) + 2)
        self.client = {n: f"http://127.0.0.1:{ports[2 * i]}" for i, n in enumerate(names)}
        self.peer = {n: f"http://127.0.0.1:{ports[2 * i + 1]}" for i, n in enumerate(names)}
        self.spare = ports[-2:]
        self.wrapper = tmp / "etcdctl"
        # Like roles/etcd's wrapper: the endpoints preset unless the caller passes its own.
        self.wrapper.write_text(
            "#!/bin/sh\nexport ETCDCTL_API=3\n"
            'case " $* " in *" --endpoints="*) ;; *) '
            f"export ETCDCTL_ENDPOINTS={','.join(self.client.values())} ;; esac\n"
            f'exec {bindir / "etcdctl"} --dial-timeout=1s "$@"\n')
        self.wrapper.chmod(0o755)
        initial = ",".join(f"{n}={self.peer[n]}" for n in names)
        for n in names:
            self.start(n, initial, "new")

    def start(self, name: str, initial: str, state: str) -> None:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        self.procs[name] = subprocess.Popen(
            [str(self.bindir / "etcd"), "--name", name, "--data-dir", str(self.tmp / name),
             "--listen-client-urls", self.client[name], "--advertise-client-urls",
             self.client[name], "--listen-peer-urls", self.peer[name],
             "--initial-advertise-peer-urls", self.peer[name], "--initial-cluster", initial,
             "--initial-cluster-state", state, "--initial-cluster-token", "t-sandbox-etcd",
             "--listen-metrics-urls", "", "--log-level", "error"],
            stdout=log, stderr=log)

    def stop(self, name: str) -> None:
        self.procs[name].terminate()
        self.procs[name].wait(timeout=30)

    def etcdctl(self, *args: str) -> str:
        return subprocess.run([str(self.wrapper), *args], capture_output=True, text=True,
                              check=True).stdout

    def op(self, **params: Any) -> dict[str, Any]:
        """The module run by Ansible on this host, as the roles run it."""
        return run_module("sandbox_etcd", {"etcdctl": str(self.wrapper), **params})[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("etcd")
    c = Cluster(tmp, _etcd_binaries(tmp), ["m1", "m2", "m3"])
    try:
        res = c.op(op="healthy", cluster=True, timeout=60)
        assert res["ok"], res
        yield c
    finally:
        for p in c.procs.values():
            p.kill()
            p.wait()


def test_status_names_the_leader_and_orders_it_last(cluster: Cluster) -> None:
    res = cluster.op(op="status", count=3, timeout=30)
    assert res["ok"] and not res["changed"], res
    names = [m["name"] for m in res["members"]]
    assert sorted(names) == ["m1", "m2", "m3"]
    leader = res["leader"]["name"]
    assert res["order_leader_last"][-1] == leader and sorted(res["order_leader_last"]) == sorted(names)
    assert all(m["version"].startswith("3.") and m["answered"] for m in res["members"])


def test_move_leader_moves_it_to_the_preferred_member(cluster: Cluster) -> None:
    leader = cluster.op(op="status", timeout=30)["leader"]["name"]
    other = sorted({"m1", "m2", "m3"} - {leader})
    res = cluster.op(op="move_leader", member=leader, prefer=[other[1], other[0]])
    assert res["changed"] and res["moved_to"] == other[1], res
    after = cluster.op(op="status", timeout=30)
    assert after["leader"]["name"] == other[1], after
    # a member that does not lead: nothing to do
    res = cluster.op(op="move_leader", member=leader, prefer=[leader])
    assert not res["changed"] and res["moved_to"] == "", res


def test_data_equal_at_one_revision_under_writes(cluster: Cluster) -> None:
    stop = threading.Event()
    written = []

    def write() -> None:
        i = 0
        while not stop.is_set():
            cluster.etcdctl("put", f"/t/key-{i}", "x" * 100)
            written.append(i)
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        time.sleep(1)
        res = cluster.op(op="data_equal", count=3, timeout=30)
    finally:
        stop.set()
        writer.join()
    assert written, "the writer wrote nothing"
    assert res["ok"] and len(res["hashkv"]) == 3, res
    assert len({h["HashKV"]["hash"] for h in res["hashkv"]}) == 1
    assert res["revision"] > 1 and f"at revision {res['revision']}" in res["detail"]


def test_data_equal_on_an_idle_cluster_compacted_at_its_head(cluster: Cluster) -> None:
    # etcd's periodic compaction of an idle cluster compacts at the head revision, and hashkv
    # refuses --rev at the compacted revision ("required revision has been compacted"): the
    # comparison must still succeed (it failed verify on every idle sandbox with compaction).
    cluster.etcdctl("put", "/t/idle", "x")
    head = int(json.loads(cluster.etcdctl("endpoint", "status", "-w", "json"))[0]
               ["Status"]["header"]["revision"])
    cluster.etcdctl("compaction", "--physical", str(head))
    res = cluster.op(op="data_equal", count=3, timeout=10, require=False)
    assert res["ok"] and len(res["hashkv"]) == 3, res
    assert {h["HashKV"]["compact_revision"] for h in res["hashkv"]} == {head}, res


def test_healthy_fails_at_its_deadline_with_a_member_down(cluster: Cluster) -> None:
    cluster.stop("m3")
    try:
        t0 = time.monotonic()
        res = cluster.op(op="healthy", endpoints=[cluster.client["m3"]], timeout=3,
                         require=False)
        assert not res["ok"] and time.monotonic() - t0 >= 3, res
        failed = cluster.op(op="healthy", cluster=True, timeout=2)
        assert failed.get("failed") and "etcd healthy: not reached in 2 s" in failed["msg"], failed
        two = cluster.op(op="healthy", endpoints=[cluster.client["m1"], cluster.client["m2"]])
        assert two["ok"], two
    finally:
        initial = ",".join(f"{n}={cluster.peer[n]}" for n in ("m1", "m2", "m3"))
        cluster.start("m3", initial, "existing")
    res = cluster.op(op="healthy", cluster=True, timeout=60)
    assert res["ok"], res


def test_promote_a_learner_once_it_is_in_sync(cluster: Cluster) -> None:
    name, client, peer = "m4", *(f"http://127.0.0.1:{p}" for p in cluster.spare)
    cluster.client[name], cluster.peer[name] = client, peer
    # etcd refuses `member add` ("unhealthy cluster") until every voting member has been
    # connected for its health interval (5 s): m3 restarted just before.
    deadline = time.monotonic() + 30
    while True:
        added = subprocess.run([str(cluster.wrapper), "member", "add", name, f"--peer-urls={peer}",
                                "--learner"], capture_output=True, text=True, check=False)
        if added.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert added.returncode == 0, added.stderr
    initial = ",".join(f"{n}={cluster.peer[n]}" for n in ("m1", "m2", "m3", "m4"))
    cluster.start(name, initial, "existing")
    res = cluster.op(op="promote", peer_url=peer, timeout=60)
    assert res["ok"] and res["changed"], res
    listed = json.loads(cluster.etcdctl("member", "list", "-w", "json"))["members"]
    assert [m.get("isLearner", False) for m in listed if peer in m["peerURLs"]] == [False]
    again = cluster.op(op="promote", peer_url=peer)
    assert again["ok"] and not again["changed"] and again["detail"] == "not a learner", again
