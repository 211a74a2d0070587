"""roles/etcd/files/etcd_defrag_guard.py, the fragmentation guard every member runs each minute
(k0sbox-etcd-defrag-guard.timer): its rules on etcdctl's JSON, then the script run as the
timer runs it (the nodes' /usr/bin/python3, the unit's options) against REAL etcd on
loopback:

- three members of the sandbox's etcd build (scripts/fetch-etcd-debs) with a 16 MiB quota,
  plain HTTP: nothing done below the line or when the file is data rather than free pages; a
  fragmented file (1 MB values written, deleted, compacted) left alone in another member's
  minute, with --dry-run, and while another member does not answer (SIGSTOP); defragmented in
  its own minute, the leader after handing leadership over; NOSPACE raised by filling the quota,
  the fill deleted and compacted: each guard defragments its member in its minute and the one
  that finds every file below the line disarms the alarm, so writes are accepted again;
- one member with mTLS and RBAC (tests/test_hostile_tenant.py's member, the admin certificate
  CN root as roles/etcd's wrapper holds it): defragmented; with a tenant's certificate the
  guard fails saying why (etcd 3.5.30 refuses a non-root member status);
- Debian 12's etcd 3.4.23 (apt-get download), one member: the same JSON, defragmented.
"""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import free_ports
from test_sandbox_etcd import _etcd_binaries

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "roles" / "etcd" / "files" / "etcd_defrag_guard.py"
NODE_PYTHON = "/usr/bin/python3"   # the interpreter of the script's shebang on the members
QUOTA = 16 * 1024 * 1024
RATIO, FREE_SHARE = 0.5, 0.25      # roles/etcd's defaults
LINE = int(RATIO * QUOTA)
MB = b"x" * 1_000_000



def _load_guard() -> Any:
    """The script imported as a module (registered first: its dataclasses need it)."""
    spec = importlib.util.spec_from_file_location("etcd_defrag_guard", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


guard_mod = _load_guard()


# -- the rules ------------------------------------------------------------------------------


@pytest.mark.parametrize(("db_size", "in_use", "fragmented"), [
    (LINE - 1, 0, False),                  # below the line: never, however free
    (LINE, LINE // 4 * 3, True),           # at the line, exactly a quarter free
    (LINE, LINE // 4 * 3 + 4096, False),   # at the line, a page less than a quarter free
    (QUOTA, QUOTA - QUOTA // 5, False),    # full, but 80 % data: a defrag gives little back
    (QUOTA, 1_000_000, True),
    (QUOTA, None, False),                  # no dbSizeInUse (before etcd 3.4): unknown
])
def test_fragmented_means_past_the_line_with_a_quarter_free(db_size: int, in_use: int | None,
                                                             fragmented: bool) -> None:
    assert guard_mod.is_fragmented(db_size, in_use, QUOTA, RATIO, FREE_SHARE) is fragmented


def test_slots_follow_the_started_members_by_name() -> None:
    members = [guard_mod.Member.of(m) for m in [
        {"ID": 30, "name": "etcd-3", "clientURLs": ["https://10.0.0.13:2379"]},
        {"ID": 10, "name": "etcd-1", "clientURLs": ["https://10.0.0.11:2379"]},
        {"ID": 40, "peerURLs": ["https://10.0.0.14:2380"], "isLearner": True},   # not started
        {"ID": 20, "name": "etcd-2", "clientURLs": ["https://10.0.0.12:2379"], "isLearner": True},
    ]]
    assert [guard_mod.slot_of(members, i) for i in (10, 20, 30)] == [(0, 3), (1, 3), (2, 3)]
    assert guard_mod.slot_of(members, 40) == (-1, 3)


def test_statuses_of_3_4_3_5_and_3_6_and_alarms_as_etcdctl_prints_them() -> None:
    v34: dict[str, Any] = {"Endpoint": "http://a:2379", "Status": {
        "header": {"cluster_id": 1, "member_id": 7, "revision": 9, "raft_term": 2},
        "version": "3.4.23", "dbSize": 20480, "leader": 7, "raftIndex": 9, "raftTerm": 2,
        "raftAppliedIndex": 9, "dbSizeInUse": 16384}}
    s = guard_mod.Status.of(v34)
    assert (s.member_id, s.leader, s.db_size, s.in_use, s.quota, s.errors) == (7, 7, 20480, 16384, 0, ())
    v36 = {**v34, "Status": {**v34["Status"], "version": "3.6.14", "dbSizeQuota": 2147483648,
                             "errors": ["memberID:7 alarm:NOSPACE "]}}
    s = guard_mod.Status.of(v36)
    assert s.quota == 2147483648 and s.errors == ("memberID:7 alarm:NOSPACE ",)
    assert guard_mod.Status.of({"Endpoint": "x", "Status": {"dbSize": 5}}).in_use is None
    listing = {"header": {}, "alarms": [{"memberID": 7, "alarm": 1}, {"memberID": 8, "alarm": 2}]}
    assert guard_mod.alarm_names(listing) == ["NOSPACE", "CORRUPT"]
    assert guard_mod.alarm_names({"header": {}}) == []


# -- against real etcd ----------------------------------------------------------------------


class Members:
    """Plain-HTTP members on loopback with a backend quota, no auto-compaction (the tests
    compact), and an etcdctl wrapper that presets every endpoint unless the caller passes
    --endpoints, as roles/etcd's does."""

    def __init__(self, tmp: Path, bindir: Path, names: list[str], quota: int = QUOTA) -> None:
        self.tmp, self.bindir, self.quota, self.procs = tmp, bindir, quota, {}
        ports = free_ports(2 * len(names))
        self.client = {n: f"http://127.0.0.1:{ports[2 * i]}" for i, n in enumerate(names)}
        self.peer = {n: f"http://127.0.0.1:{ports[2 * i + 1]}" for i, n in enumerate(names)}
        self.wrapper = tmp / "etcdctl"
        self.wrapper.write_text(
            "#!/bin/sh\nexport ETCDCTL_API=3\n"
            'case " $* " in *" --endpoints="*) ;; *) '
            f"export ETCDCTL_ENDPOINTS={','.join(self.client.values())} ;; esac\n"
            f'exec {bindir / "etcdctl"} "$@"\n')
        self.wrapper.chmod(0o755)
        initial = ",".join(f"{n}={self.peer[n]}" for n in names)
        for n in names:
            log = open(tmp / f"{n}.log", "ab")  # noqa: SIM115 - closed with the process
            self.procs[n] = subprocess.Popen(
                [str(bindir / "etcd"), "--name", n, "--data-dir", str(tmp / n),
                 "--listen-client-urls", self.client[n], "--advertise-client-urls", self.client[n],
                 "--listen-peer-urls", self.peer[n], "--initial-advertise-peer-urls", self.peer[n],
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--initial-cluster-token", "t-defrag-guard", "--listen-metrics-urls", "",
                 "--quota-backend-bytes", str(quota), "--log-level", "error"],
                stdout=log, stderr=log)
        self.await_(lambda: all(self.status(n) for n in names), "every member answers")

    def ctl(self, *args: str, data: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run([str(self.wrapper), "--command-timeout=20s", *args], input=data,
                              capture_output=True, check=False, timeout=60)
        assert not check or done.returncode == 0, (args, done.stderr)
        return done

    def status(self, name: str) -> dict[str, Any]:
        done = self.ctl("endpoint", "status", "-w", "json", f"--endpoints={self.client[name]}",
                        check=False)
        return json.loads(done.stdout)[0]["Status"] if done.returncode == 0 else {}

    def leader(self) -> str:
        st = {n: self.status(n) for n in self.client}
        return next(n for n, s in st.items() if s["leader"] == s["header"]["member_id"])

    def await_(self, ready: Any, what: str, deadline: float = 60) -> None:
        end = time.monotonic() + deadline
        while not ready():
            assert time.monotonic() < end, f"not reached in {deadline:g} s: {what}"
            time.sleep(0.2)

    def clean(self) -> None:
        """Every member defragmented and no alarm, whatever a test before left (pytest-xdist
        may run this file's tests on several workers, each with its own members)."""
        self.ctl("defrag")
        self.ctl("alarm", "disarm")

    def fragment(self, values: int, prefix: str = "/frag/") -> None:
        """`values` 1 MB values under distinct keys, then deleted and compacted away: the
        file keeps its size, its pages free (awaited on every member). A 1 MB value takes
        about 2 MB of file as it is written (bbolt rewrites the leaf of the value before it):
        7 make 11-13 MB, past the 8.4 MB line and clear of the 16.8 MB quota."""
        for i in range(values):
            self.ctl("put", f"{prefix}{i:03d}", data=MB)
        self.compact_away(prefix)

    def compact_away(self, prefix: str) -> None:
        self.ctl("del", "--prefix", prefix)
        rev = self.status(next(iter(self.client)))["header"]["revision"]
        self.ctl("compaction", "--physical", str(rev))

        def fragmented() -> bool:
            # bbolt counts the pages a transaction freed as in use until two commits later
            # (readers may still see them): a small write makes etcd commit, as traffic does
            self.ctl("put", "/tick", "x", check=False)
            return all(guard_mod.is_fragmented(s["dbSize"], s.get("dbSizeInUse"), self.quota,
                                               RATIO, FREE_SHARE)
                       for s in map(self.status, self.client))

        self.await_(fragmented, "a fragmented file")

    def guard(self, name: str, minute: int, *extra: str) -> tuple[dict[str, Any], int]:
        """The script as the timer runs it (its unit's options), with --json and the minute."""
        done = subprocess.run(
            [NODE_PYTHON, str(SCRIPT), "--etcdctl", str(self.wrapper), "--endpoint",
             self.client[name], "--name", name, "--quota", str(self.quota), "--ratio",
             str(RATIO), "--free-share", str(FREE_SHARE), "--minute", str(minute), "--json", *extra],
            capture_output=True, text=True, check=False, timeout=400)
        assert done.stdout.strip(), done.stderr
        return json.loads(done.stdout), done.returncode

    def stop(self) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Members]:
    if not Path(NODE_PYTHON).exists():
        pytest.skip(f"SKIPPED LOUDLY: no {NODE_PYTHON} (the members' interpreter) on this host")
    tmp = tmp_path_factory.mktemp("guard")
    m = Members(tmp, _etcd_binaries(tmp), ["m1", "m2", "m3"])
    yield m
    m.stop()


SLOT = {"m1": 0, "m2": 1, "m3": 2}   # member names sorted


def own_minute(name: str) -> int:
    return 29_000_001 * 3 + SLOT[name]


def test_below_the_line_or_full_of_data_it_does_nothing(members: Members) -> None:
    members.clean()
    for name in SLOT:
        report, rc = members.guard(name, own_minute(name))
        assert rc == 0 and report["action"] == "none" and not report["fragmented"], report
        assert "nothing to do" in report["reason"] and report["db_size"] < LINE
    # 9 MB of data kept (100 KB values: few pages free; a 1 MB value rewrites its neighbour's
    # leaf and frees as much): past the line, but a defragmentation would give little back
    for i in range(90):
        members.ctl("put", f"/data/{i:03d}", data=MB[:100_000])
    before = members.status("m1")
    assert before["dbSize"] >= LINE, before
    report, rc = members.guard("m1", own_minute("m1"))
    assert rc == 0 and report["action"] == "none" and not report["fragmented"], report
    assert "past the 8.4 MB line but less than 25% of it free (data" in report["reason"], report
    # not shrunk (it may grow by the writes' last commit, every 100 ms)
    assert members.status("m1")["dbSize"] >= before["dbSize"]
    members.compact_away("/data/")


def test_a_fragmented_file_waits_for_its_minute_and_every_member(members: Members) -> None:
    members.clean()
    members.fragment(7)
    size = members.status("m1")["dbSize"]
    assert size >= LINE
    # another member's minute: nothing, and one etcdctl call less than an action
    for minute in (own_minute("m2"), own_minute("m3")):
        report, rc = members.guard("m1", minute)
        assert rc == 0 and report["action"] == "waits" and report["fragmented"], report
        assert f"minute {minute} is slot {minute % 3}'s" in report["reason"]
    report, rc = members.guard("m1", own_minute("m1"), "--dry-run")
    assert rc == 0 and report["action"] == "dry-run" and "would defragment" in report["reason"]
    # a member that does not answer (stopped here; a member still defragmenting past its
    # minute answers no read either): no member to spare, nothing done
    members.procs["m3"].send_signal(signal.SIGSTOP)
    try:
        report, rc = members.guard("m1", own_minute("m1"))
    finally:
        members.procs["m3"].send_signal(signal.SIGCONT)
    assert rc == 0 and report["action"] == "skipped", report
    assert "m3 does not answer within 5 s" in report["reason"]
    assert members.status("m1")["dbSize"] >= size   # not defragmented


def test_each_member_is_defragmented_in_its_own_minute_the_leader_handing_over_first(
        members: Members) -> None:
    members.clean()
    members.fragment(7)
    for name in SLOT:
        leader = members.leader()
        before = members.status(name)
        t0 = time.monotonic()
        report, rc = members.guard(name, own_minute(name))
        took = time.monotonic() - t0
        assert rc == 0 and report["action"] == "defragmented", report
        assert report["db_size"] == before["dbSize"] and report["after_db_size"] < LINE, report
        assert members.status(name)["dbSize"] == report["after_db_size"]
        if name == leader:
            # to the member whose minute came before this one's (m1's: m3)
            previous = sorted(SLOT)[SLOT[name] - 1]
            assert report["leader_moved_to"] == previous, report
            assert members.leader() == previous
        else:
            assert report["leader_moved_to"] == ""
        print(f"{name}{' (leader)' if name == leader else ''}: {report['db_size']} -> "
              f"{report['after_db_size']} bytes, defrag {report['seconds']} s, run {took:.2f} s")
    # done: the next minute finds nothing to do
    report, rc = members.guard("m1", own_minute("m1"))
    assert rc == 0 and report["action"] == "none", report


def test_nospace_is_disarmed_by_the_guard_that_finds_every_file_below_the_line(
        members: Members) -> None:
    members.clean()
    for i in range(40):
        done = members.ctl("put", f"/fill/{i:03d}", data=MB, check=False)
        if done.returncode != 0:
            assert b"database space exceeded" in done.stderr, done.stderr
            break
    else:
        pytest.fail("the 16 MiB quota was never reached")
    assert b"NOSPACE" in members.ctl("alarm", "list").stdout
    members.compact_away("/fill/")   # deletes and compaction pass under NOSPACE
    reports = {}
    for name in SLOT:
        reports[name], rc = members.guard(name, own_minute(name))
        assert rc == 0 and reports[name]["action"] == "defragmented", reports[name]
        assert set(reports[name]["alarms"]) == {"NOSPACE"}   # raised by one member or more
        print(f"{name}: {reports[name]['db_size']} -> {reports[name]['after_db_size']} bytes; "
              f"{reports[name]['alarm_reason']}")
    # m1 and m2 left it: the members after them were still above the line
    assert not reports["m1"]["disarmed"] and not reports["m2"]["disarmed"]
    stays = "NOSPACE stays: at or above the 8.4 MB line: "
    assert reports["m1"]["alarm_reason"].startswith(stays), reports["m1"]
    assert "m2 " in reports["m1"]["alarm_reason"] and "m3 " in reports["m1"]["alarm_reason"]
    assert reports["m2"]["alarm_reason"].startswith(stays + "m3 "), reports["m2"]
    assert reports["m3"]["disarmed"] and "disarmed NOSPACE" in reports["m3"]["alarm_reason"]
    assert members.ctl("alarm", "list").stdout.strip() == b""
    members.ctl("put", "/after", "accepted")


def test_the_human_log_line_says_what_it_did(members: Members) -> None:
    members.clean()
    done = subprocess.run([NODE_PYTHON, str(SCRIPT), "--etcdctl", str(members.wrapper),
                           "--endpoint", members.client["m2"], "--name", "m2", "--quota",
                           str(QUOTA)], capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("m2: file ") and "of the 16.8 MB quota" in done.stdout
    assert "nothing to do" in done.stdout
    # the member's status unreadable: exit 1, saying why
    bad = subprocess.run([NODE_PYTHON, str(SCRIPT), "--etcdctl", str(members.wrapper),
                          "--endpoint", f"http://127.0.0.1:{free_ports(1)[0]}", "--timeout", "2",
                          "--dial-timeout", "1"], capture_output=True, text=True, check=False,
                         timeout=60)
    assert bad.returncode == 1 and "its status could not be read" in bad.stdout, bad


def test_with_rbac_and_tls_the_admin_certificate_defragments(tmp_path: Path) -> None:
    from test_hostile_tenant import QUOTA as RBAC_QUOTA
    from test_hostile_tenant import Member, _binaries, _pki

    _pki(tmp_path)
    m = Member(tmp_path, _binaries(tmp_path, None))
    try:
        def wrapper(who: str) -> Path:
            path = tmp_path / f"etcdctl-{who}"
            path.write_text("#!/bin/sh\nexec " + " ".join(m.ctl(who)[:1] + m.ctl(who)[2:])
                            + ' "$@"\n')
            path.chmod(0o755)
            return path

        def status() -> dict[str, Any]:
            st: dict[str, Any] = json.loads(m.admin("endpoint", "status", "-w", "json"))[0]["Status"]
            return st

        def await_(ready: Any, what: str) -> None:
            end = time.monotonic() + 30
            while not ready():
                assert time.monotonic() < end, f"{what}: {status()}"
                time.sleep(0.2)

        # 500 KB values until the file is past its 4.2 MB line (each adds about 1 MB of file),
        # clear of the 8.4 MB quota; then deleted and compacted away
        line = int(RATIO * RBAC_QUOTA)
        for i in range(12):
            done = subprocess.run(m.ctl("root") + ["put", f"/tenant-a/frag-{i}"], input=MB[:500_000],
                                  capture_output=True, check=False, timeout=30)
            assert done.returncode == 0, done.stderr
            if status()["dbSize"] >= line + 1_000_000:
                break
        m.admin("del", "--prefix", "/tenant-a/frag-")
        m.admin("compaction", "--physical", str(status()["header"]["revision"]))

        def fragmented() -> bool:
            m.admin("put", "/tenant-a/tick", "x")   # a commit, so that the freed pages count
            st = status()
            return bool(guard_mod.is_fragmented(st["dbSize"], st["dbSizeInUse"], RBAC_QUOTA,
                                                RATIO, FREE_SHARE))

        await_(fragmented, "a fragmented file")
        args = ["--endpoint", m.client, "--name", "m1", "--quota", str(RBAC_QUOTA), "--json"]
        denied = subprocess.run([NODE_PYTHON, str(SCRIPT), "--etcdctl", str(wrapper("tenant-a")),
                                 *args], capture_output=True, text=True, check=False, timeout=60)
        report = json.loads(denied.stdout)
        assert denied.returncode == 1 and "permission denied" in report["reason"], report
        done = subprocess.run([NODE_PYTHON, str(SCRIPT), "--etcdctl", str(wrapper("root")), *args],
                              capture_output=True, text=True, check=False, timeout=120)
        report = json.loads(done.stdout)
        assert done.returncode == 0 and report["action"] == "defragmented", report
        assert report["db_size"] >= RBAC_QUOTA // 2 > report["after_db_size"], report
        print(f"mTLS+RBAC: {report['db_size']} -> {report['after_db_size']} bytes")
    finally:
        m.stop()


def test_debian_12_etcd_3_4_23(tmp_path: Path) -> None:
    done = subprocess.run(["apt-get", "download", "etcd-server=3.4.23-4+b4",
                           "etcd-client=3.4.23-4+b4"], cwd=tmp_path, capture_output=True,
                          text=True, check=False)
    debs = sorted(tmp_path.glob("etcd-*_3.4.23*.deb"))
    if done.returncode != 0 or len(debs) != 2:
        pytest.skip(f"SKIPPED LOUDLY: Debian 12's etcd 3.4.23 cannot be had here: "
                    f"{done.stderr.strip()[-200:]}")
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(tmp_path / "root")], check=True)
    one = Members(tmp_path, tmp_path / "root" / "usr" / "bin", ["solo"])
    try:
        assert one.status("solo")["version"].startswith("3.4.")
        one.fragment(7)
        report, rc = one.guard("solo", 12345)   # one member: every minute is its own
        assert rc == 0 and report["action"] == "defragmented" and report["count"] == 1, report
        assert report["version"].startswith("3.4.") and report["after_db_size"] < LINE, report
        print(f"etcd {report['version']}: {report['db_size']} -> {report['after_db_size']} bytes")
    finally:
        one.stop()
