"""plugins/modules/sandbox_etcd_prefix.py: one tenant's prefix copied at one revision and
written back in transactions.

Its plain functions, then the module run by Ansible against a real etcd on loopback (etcd and
etcdctl of roles/etcd's pinned Debian packages, as tests/test_sandbox_etcd.py runs them): a
copy taken while a client writes equals the prefix as of the copy's revision; the prefix
replaced by the copy (values with every byte, a leased key, more keys than one transaction
may hold) while another prefix keeps its keys and revisions; a second run changes nothing;
a damaged copy and a stale guard are refused.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import load_plugin, run_module
from test_sandbox_etcd import Cluster, _etcd_binaries

prefix_mod = load_plugin("plugins/modules/sandbox_etcd_prefix.py")

BINARY = bytes(range(256)) + b'"quoted" \\ back\nslash -flag'


def test_range_end_is_the_next_prefix() -> None:
    assert prefix_mod.range_end(b"/tenant-a/") == b"/tenant-a0"
    assert prefix_mod.range_end(b"a\xff") == b"b"
    assert prefix_mod.range_end(b"\xff\xff") == b"\x00"


def test_plan_deletes_what_the_copy_lacks_and_puts_what_differs() -> None:
    def rec(key: str, value: str, mod: int = 5, lease: int = 0) -> dict[str, Any]:
        return {"key": key.encode(), "value": value.encode(), "mod_revision": mod, "lease": lease}

    copy = [rec("/t/a", "1"), rec("/t/b", "2"), rec("/t/c", "3"), rec("/t/e", "5", lease=7)]
    now = [rec("/t/a", "1", 9), rec("/t/b", "changed", 10), rec("/t/d", "new", 11),
           rec("/t/e", "5", 12)]
    ops = prefix_mod.plan(copy, now)
    assert [(o["op"], o["key"], o["mod_revision"]) for o in ops] == [
        ("del", b"/t/d", 11), ("put", b"/t/b", 10), ("put", b"/t/c", 0), ("put", b"/t/e", 12)]
    assert ops[3]["lease"] is True
    assert prefix_mod.plan(copy, copy) == []


def test_batches_respect_the_operation_and_byte_limits() -> None:
    ops = [{"op": "put", "key": b"k%03d" % i, "value": b"v" * 96} for i in range(300)]
    sizes = [len(b) for b in prefix_mod.batches(ops, 128, 10**6)]
    assert sizes == [128, 128, 44]
    assert [len(b) for b in prefix_mod.batches(ops, 128, 1000)][:2] == [10, 10]
    with pytest.raises(prefix_mod.PrefixError, match="more than max_txn_bytes"):
        prefix_mod.batches(ops, 128, 50)


def test_go_quote_escapes_every_byte_outside_printable_ascii() -> None:
    assert prefix_mod.go_quote(b'a"b\\c\n\xff') == '"a\\"b\\\\c\\x0a\\xff"'


# -- the module on a real etcd ---------------------------------------------------------------


class Etcd(Cluster):
    def op(self, **params: Any) -> dict[str, Any]:
        return run_module("sandbox_etcd_prefix",
                          {"etcdctl": str(self.bindir / "etcdctl"),
                           "endpoints": list(self.client.values()), **params})[0]

    def get(self, prefix: str, *extra: str) -> list[dict[str, Any]]:
        out = json.loads(self.etcdctl("get", "--prefix", prefix, *extra, "-w", "json"))
        return [prefix_mod.decode_kv(kv) for kv in out.get("kvs", [])]


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    tmp = tmp_path_factory.mktemp("etcd-prefix")
    e = Etcd(tmp, _etcd_binaries(tmp), ["p1"])
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([str(e.wrapper), "endpoint", "health"], capture_output=True,
                             check=False).returncode != 0:
            assert time.monotonic() < deadline, "etcd on loopback did not become healthy in 60 s"
            time.sleep(0.5)
        yield e
    finally:
        for p in e.procs.values():
            p.kill()
            p.wait()


def _put(etcd: Etcd, key: str, value: bytes, *extra: str) -> None:
    subprocess.run([str(etcd.wrapper), "put", *extra, "--", key], input=value, check=True,
                   capture_output=True)


def _put_many(etcd: Etcd, items: dict[str, bytes]) -> None:
    """Set-up writes of plain keys and values, 100 to a transaction (one etcdctl each rather
    than one per key: the set-up of the tests below was 880 etcdctl runs, 40 s)."""
    pairs = list(items.items())
    for i in range(0, len(pairs), 100):
        ops = "\n".join(f"put {k} {v.decode()}" for k, v in pairs[i:i + 100])
        done = subprocess.run([str(etcd.wrapper), "txn"], input=f"\n{ops}\n\n\n".encode(),
                              check=False, capture_output=True)
        assert done.returncode == 0 and done.stdout.startswith(b"SUCCESS"), done


def _values(records: list[dict[str, Any]]) -> dict[bytes, bytes]:
    return {base64.b64decode(r["key"]): base64.b64decode(r.get("value", "")) for r in records}


def test_a_copy_under_writes_is_the_prefix_at_its_revision(etcd: Etcd, tmp_path: Path) -> None:
    for i in range(40):
        _put(etcd, f"/ta/obj-{i:03d}", f"v{i}".encode())
    _put(etcd, "/tb/other", b"not tenant a")
    stop, written = threading.Event(), []

    def write() -> None:
        i = 0
        while not stop.is_set():
            _put(etcd, f"/ta/obj-{i % 60:03d}", f"w{i}".encode())
            written.append(i)
            i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        res = etcd.op(op="dump", prefix="/ta/", dest=str(tmp_path / "ta.tenant"), page=7)
    finally:
        stop.set()
        writer.join()
    assert res.get("changed") and not res.get("failed"), res
    lines = (tmp_path / "ta.tenant").read_text().splitlines()
    header, records = json.loads(lines[0]), [json.loads(x) for x in lines[1:]]
    # the writer changed the prefix after the copy's revision: the copy is the prefix then
    assert written and max(int(r["mod_revision"]) for r in etcd.get("/ta/")) > res["revision"]
    at_rev = etcd.get("/ta/", f"--rev={res['revision']}")
    assert records == at_rev and len(records) >= 40
    assert header == {**header, "prefix": "/ta/", "revision": res["revision"],
                      "key_count": len(records), "format": prefix_mod.FORMAT}
    assert res["key_count"] == len(records) and res["bytes"] == sum(
        len(k) + len(v) for k, v in _values(records).items())
    assert (tmp_path / "ta.tenant").stat().st_mode & 0o777 == 0o600
    assert not any(base64.b64decode(r["key"]).startswith(b"/tb/") for r in records)


def test_replace_makes_the_prefix_the_copy_and_leaves_others_alone(etcd: Etcd, tmp_path: Path) -> None:
    _put_many(etcd, {f"/tr/obj-{i:03d}": f"v{i}".encode() for i in range(300)})
    _put(etcd, "/tr/binary", BINARY)
    lease = json.loads(etcd.etcdctl("lease", "grant", "600", "-w", "json"))["ID"]
    _put(etcd, "/tr/event", b"leased", f"--lease={lease:x}")
    dump = etcd.op(op="dump", prefix="/tr/", dest=str(tmp_path / "tr.tenant"))
    copy = _values(etcd.get("/tr/", f"--rev={dump['revision']}"))
    # afterwards: 250 changed, 50 deleted, 200 new, the binary value changed, the
    # leased key gone: 502 operations
    _put_many(etcd, {f"/tr/obj-{i:03d}": b"changed" for i in range(250)})
    etcd.etcdctl("del", "/tr/obj-250", "/tr/obj-300")
    _put_many(etcd, {f"/tr/new-{i:03d}": b"new" for i in range(200)})
    _put(etcd, "/tr/binary", b"plain")
    etcd.etcdctl("lease", "revoke", f"{lease:x}")      # the leased key expires meanwhile
    others = {"/tb/other": b"b", "/tr-other/x": b"outside", "/tq/x": b"q"}
    for key, value in others.items():
        _put(etcd, key, value)
    before = {r["key"]: r["mod_revision"] for p in ("/tb/", "/tr-", "/tq/") for r in etcd.get(p)}

    digest = dump["sha256"]
    res = etcd.op(op="replace", prefix="/tr/", src=str(tmp_path / "tr.tenant"), sha256=digest)
    assert res.get("changed") and not res.get("failed"), res
    assert (res["deleted"], res["put"]) == (200, 302), res
    assert res["transactions"] == 4                    # 128 operations at most each
    after = etcd.get("/tr/")
    assert _values(after) == copy and res["key_count"] == len(copy) == 302
    assert _values(after)[b"/tr/binary"] == BINARY
    leased = [r for r in after if base64.b64decode(r["key"]) == b"/tr/event"]
    assert leased[0]["lease"] not in (0, lease)        # a new lease of lease_ttl
    assert {r["key"]: r["mod_revision"] for p in ("/tb/", "/tr-", "/tq/") for r in etcd.get(p)} == before

    again = etcd.op(op="replace", prefix="/tr/", src=str(tmp_path / "tr.tenant"), sha256=digest)
    assert not again.get("changed") and again["transactions"] == 0, again

    # etcd's limit is real: more operations per transaction than --max-txn-ops are refused
    _put_many(etcd, {f"/tr/extra-{i:03d}": b"x" for i in range(130)})
    refused = etcd.op(op="replace", prefix="/tr/", src=str(tmp_path / "tr.tenant"), sha256=digest,
                      max_txn_ops=200)
    assert refused.get("failed") and "too many operations in txn request" in refused["msg"], refused
    assert (refused["committed"], refused["untouched"]) == (0, False)   # a transaction was sent
    assert len(etcd.get("/tr/extra-")) == 130           # the refused transaction changed nothing


def test_the_connection_given_as_one_client_value_is_the_same_connection(etcd: Etcd) -> None:
    """``client`` (what roles/k0s_controller passes: _k0s_etcd_client) replaces the options of
    its keys; without endpoints anywhere the module refuses, naming them."""
    _put(etcd, "/tk/a", b"1")
    plain = etcd.op(op="usage", prefix="/tk/")
    given = run_module("sandbox_etcd_prefix", {
        "op": "usage", "prefix": "/tk/", "endpoints": ["http://127.0.0.1:9"],
        "client": {"etcdctl": str(etcd.bindir / "etcdctl"), "endpoints": list(etcd.client.values()),
                   "run_as": []}})[0]
    assert (given["key_count"], given["bytes"]) == (plain["key_count"], plain["bytes"]) == (1, 6), given
    none = run_module("sandbox_etcd_prefix", {"op": "usage", "prefix": "/tk/",
                                              "client": {"etcdctl": str(etcd.bindir / "etcdctl")}})[0]
    assert none.get("failed") and "endpoints (or client.endpoints) is required" in none["msg"], none


def test_into_another_prefix_and_a_damaged_copy(etcd: Etcd, tmp_path: Path) -> None:
    _put(etcd, "/ts/a", b"1")
    _put(etcd, "/ts/b", b"2")
    dump = etcd.op(op="dump", prefix="/ts/", dest=str(tmp_path / "ts.tenant"))
    res = etcd.op(op="replace", prefix="/tc/", source_prefix="/ts/", src=str(tmp_path / "ts.tenant"),
                  sha256=dump["sha256"])
    assert res.get("changed") and _values(etcd.get("/tc/")) == {b"/tc/a": b"1", b"/tc/b": b"2"}, res
    usage = etcd.op(op="usage", prefix="/tc/")
    assert (usage["key_count"], usage["bytes"], usage.get("changed")) == (2, 12, False), usage

    wrong = etcd.op(op="replace", prefix="/tc/", source_prefix="/tx/", src=str(tmp_path / "ts.tenant"))
    assert wrong.get("failed") and "the copy is of prefix /ts/, not /tx/" in wrong["msg"], wrong
    _put(etcd, "/ts/a", b"changed")
    damaged = etcd.op(op="replace", prefix="/ts/", src=str(tmp_path / "ts.tenant"), sha256="0" * 64)
    assert damaged.get("failed") and "the copy is damaged or not that one" in damaged["msg"], damaged
    assert _values(etcd.get("/ts/a")) == {b"/ts/a": b"changed"}


def test_a_restore_interrupted_between_transactions_is_finished_by_a_rerun(
        etcd: Etcd, tmp_path: Path) -> None:
    _put_many(etcd, {f"/ti/obj-{i:03d}": b"old" for i in range(200)})
    dump = etcd.op(op="dump", prefix="/ti/", dest=str(tmp_path / "ti.tenant"))
    _put_many(etcd, {f"/ti/obj-{i:03d}": b"new" for i in range(200)})
    # etcdctl that loses its connection at the second transaction (the first one commits)
    flaky = tmp_path / "etcdctl-flaky"
    count = tmp_path / "txns"
    flaky.write_text("#!/bin/sh\n"
                     f'case " $* " in *" txn "*) echo x >>{count}; '
                     f'[ "$(wc -l <{count})" -ge 2 ] && {{ echo "Error: connection lost" >&2; exit 1; }} ;; esac\n'
                     f'exec {etcd.bindir / "etcdctl"} "$@"\n')
    flaky.chmod(0o755)
    args = {"op": "replace", "prefix": "/ti/", "src": str(tmp_path / "ti.tenant"), "sha256": dump["sha256"],
            "restore_note": {"tenant": "ti", "file": "backups/ti.tenant"}}
    cut = etcd.op(**args, etcdctl=str(flaky))
    assert cut.get("failed") and (cut["committed"], cut["untouched"]) == (1, False), cut
    assert ("transaction 2 of 2 failed: etcdctl 'txn': Error: connection lost; 1 transaction(s) "
            "were committed (0 deleted, 127 put), so the prefix is partly restored") in cut["msg"]
    values = _values(etcd.get("/ti/"))
    marker = values.pop(b"/ti/k0sbox-restore-in-progress")
    assert sorted(set(values.values())) == [b"new", b"old"]          # old and new keys mixed
    # the mix says so: the marker of the first transaction, read by usage, refused by dump
    assert json.loads(marker) | {"started": "-"} == {
        "copy": "ti.tenant", "copy_revision": dump["revision"], "committed": 1, "transactions": 2,
        "file": "backups/ti.tenant", "tenant": "ti", "started": "-"}, marker
    usage = etcd.op(op="usage", prefix="/ti/")
    assert usage["key_count"] == 200 and usage["restore"]["committed"] == 1, usage
    refused = etcd.op(op="dump", prefix="/ti/", dest=str(tmp_path / "mixed.tenant"))
    assert refused.get("failed") and ("a restore of backups/ti.tenant into /ti/ was interrupted "
                                      "after 1 of 2 transactions") in refused["msg"], refused
    assert not (tmp_path / "mixed.tenant").exists()
    res = etcd.op(**args)
    assert res.get("changed") and (res["put"], res["transactions"]) == (73, 1), res
    assert res["resumed"]["committed"] == 1, res
    assert set(_values(etcd.get("/ti/")).values()) == {b"old"} and res["key_count"] == 200
    assert etcd.op(op="usage", prefix="/ti/")["restore"] == {}
    assert not etcd.op(**args).get("changed")


def test_a_transaction_whose_keys_changed_since_they_were_read_is_refused(etcd: Etcd) -> None:
    _put(etcd, "/tg/a", b"1")
    seen = etcd.get("/tg/a")[0]["mod_revision"]
    _put(etcd, "/tg/a", b"2")                           # a writer after the read
    ctl = prefix_mod.TenantEtcd({"run_as": [], "endpoints": list(etcd.client.values()),
                                 "cacert": "", "cert": "", "key": ""}, str(etcd.bindir / "etcdctl"))
    stale = [{"op": "put", "key": b"/tg/a", "value": b"3", "lease": False, "mod_revision": seen}]
    assert not ctl.run(["txn"], prefix_mod.txn_input(stale, "")).get("succeeded")
    fresh = [{**stale[0], "mod_revision": etcd.get("/tg/a")[0]["mod_revision"]}]
    assert ctl.run(["txn"], prefix_mod.txn_input(fresh, "")).get("succeeded")
    assert _values(etcd.get("/tg/a")) == {b"/tg/a": b"3"}


# -- a hostile copy: checked whole before anything stops, and again before the replace writes --


def _manifest_of(dump: dict[str, Any], tenant: str, prefix: str, name: str) -> dict[str, Any]:
    """The manifest roles/k0s_controller/tasks/tenant_backup.yml writes beside a dump."""
    return {"manifest": prefix_mod.FORMAT, "file": name, "tenant": tenant, "prefix": prefix,
            **{k: dump[k] for k in ("revision", "key_count", "bytes", "sha256", "cluster_id")}}


def test_check_takes_a_real_copy_and_refuses_it_edited_to_hold_another_prefixs_key(
        etcd: Etcd, tmp_path: Path) -> None:
    for i in range(30):
        _put(etcd, f"/th/obj-{i:03d}", f"v{i}".encode())
    _put(etcd, "/th/binary", BINARY)
    lease = json.loads(etcd.etcdctl("lease", "grant", "600", "-w", "json"))["ID"]
    _put(etcd, "/th/event", b"leased", f"--lease={lease:x}")
    _put(etcd, "/tk/own", b"tenant k's")
    copy = tmp_path / "th-x.tenant"
    dump = etcd.op(op="dump", prefix="/th/", dest=str(copy), page=7)
    manifest = tmp_path / "th-x.tenant.manifest.json"
    manifest.write_text(json.dumps(_manifest_of(dump, "th", "/th/", copy.name)))
    check = {"op": "check", "src": str(copy), "manifest": str(manifest), "tenant": "th",
             "source_prefix": "/th/"}
    ok = etcd.op(**check, prefix="/th/")
    assert not ok.get("failed") and not ok.get("changed"), ok
    assert (ok["key_count"], ok["revision"], ok["manifest"]["sha256"]) == (32, dump["revision"], dump["sha256"])
    assert not etcd.op(**check, prefix="/tk/").get("failed")          # --as tk: the same copy

    # the colleague's edit: a key of tenant tk's prefix added, counts and sha256 recomputed
    lines = copy.read_text().splitlines()
    header = json.loads(lines[0])
    secret = {"key": base64.b64encode(b"/tk/own").decode(), "value": base64.b64encode(b"overwritten").decode(),
              "create_revision": 2, "mod_revision": 2, "version": 1, "lease": 0}
    header.update(key_count=header["key_count"] + 1, bytes=header["bytes"] + 18)
    hostile = tmp_path / "th-y.tenant"
    hostile.write_text("\n".join([json.dumps(header, sort_keys=True), *lines[1:],
                                  json.dumps(secret, sort_keys=True)]) + "\n")
    digest = hashlib.sha256(hostile.read_bytes()).hexdigest()
    (tmp_path / "th-y.tenant.manifest.json").write_text(json.dumps(
        {**_manifest_of(dump, "th", "/th/", hostile.name), "sha256": digest,
         "key_count": header["key_count"], "bytes": header["bytes"]}))
    refused = etcd.op(**{**check, "src": str(hostile), "manifest": str(tmp_path / "th-y.tenant.manifest.json")},
                      prefix="/th/")
    assert refused.get("failed") and "holds a key outside its prefix /th/" in refused["msg"], refused

    # the second line: the replace itself refuses it too, before any transaction
    before = {p: etcd.get(p) for p in ("/th/", "/tk/")}
    again = etcd.op(op="replace", prefix="/th/", src=str(hostile), sha256=digest)
    assert again.get("failed") and again["untouched"] is True and again["committed"] == 0, again
    assert "outside its prefix /th/" in again["msg"] and again["msg"].endswith("no key was changed")
    assert {p: etcd.get(p) for p in ("/th/", "/tk/")} == before
    assert _values(etcd.get("/tk/own")) == {b"/tk/own": b"tenant k's"}
