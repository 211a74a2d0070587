"""roles/crd_apiserver's filters: the etcd flags k0s would give kube-apiserver for a k0s.yaml,
the serving certificate's SANs, systemd quoting, what a node must hold; and the CLI's choice
of API (stand-in or k0s) and its verify table."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import load_plugin

REPO = Path(__file__).resolve().parents[1]


crd = load_plugin("plugins/filter/crd_apiserver.py")
TLS = {"caFile": "/etc/k0s/etcd/ca.crt", "clientCertFile": "/etc/k0s/etcd/client.crt",
       "clientKeyFile": "/etc/k0s/etcd/client.key"}


def k0s_yaml(api: dict[str, Any] | None = None, **ext: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"storage": {"type": "etcd", "etcd": {"externalCluster": ext}}}
    if api is not None:
        spec["api"] = api
    return {"apiVersion": "k0s.k0sproject.io/v1beta1", "kind": "ClusterConfig", "spec": spec}


@pytest.mark.parametrize(("extra", "args", "timeout"), [
    # k0s's defaults: request timeout 1m -> stop timeout 62 s clamped to 20, watches drained 18 s
    ({}, {"shutdown-watch-termination-grace-period": "18s"}, 20),
    # a short request timeout: 3s + 2 = 5 s (the floor), the drain 3 s
    ({"request-timeout": "3s"}, {"request-timeout": "3s",
                                 "shutdown-watch-termination-grace-period": "3s"}, 5),
    ({"request-timeout": "1m30s"}, {"request-timeout": "1m30s",
                                    "shutdown-watch-termination-grace-period": "18s"}, 20),
    ({"request-timeout": "8s"}, {"request-timeout": "8s",
                                 "shutdown-watch-termination-grace-period": "8s"}, 10),
    # the user's own drain period is kept; it counts toward the stop timeout
    ({"request-timeout": "2s", "shutdown-watch-termination-grace-period": "9s"},
     {"request-timeout": "2s", "shutdown-watch-termination-grace-period": "9s"}, 11),
    # what Go would not parse counts as not given (k0s ignores the parse error)
    ({"request-timeout": "soon"}, {"request-timeout": "soon",
                                   "shutdown-watch-termination-grace-period": "18s"}, 20),
])
def test_shutdown_is_k0s_s(extra: dict[str, str], args: dict[str, str], timeout: int) -> None:
    """k0s pkg/component/controller/apiserver.go:179-216: the supervisor's stop timeout and
    the watch drain k0s adds, so an open watch does not hold a stop for the request timeout."""
    got = crd.crd_apiserver_shutdown(k0s_yaml({"extraArgs": extra} if extra else None))
    assert got == {"args": args, "timeout_stop_sec": timeout}


def test_go_durations() -> None:
    assert crd._go_duration("1m30s") == 90 and crd._go_duration("500ms") == 0.5
    assert crd._go_duration("1h") == 3600 and crd._go_duration("1.5s") == 1.5
    assert crd._go_duration("") is None and crd._go_duration("30") is None
    assert crd._go_duration("5x") is None and crd._go_duration("1m 2s") is None


def test_etcd_args_with_tls_are_k0s_s() -> None:
    cfg = k0s_yaml(endpoints=["https://10.0.0.11:2379", "https://10.0.0.12:2379"],
                   etcdPrefix="tenant-a", **TLS)
    assert crd.crd_apiserver_etcd_args(cfg) == {
        "etcd-servers": "https://10.0.0.11:2379,https://10.0.0.12:2379",
        "etcd-cafile": TLS["caFile"], "etcd-certfile": TLS["clientCertFile"],
        "etcd-keyfile": TLS["clientKeyFile"], "etcd-prefix": "tenant-a"}


def test_etcd_args_without_tls_have_no_tls_flags() -> None:
    args = crd.crd_apiserver_etcd_args(k0s_yaml(endpoints=["http://10.0.0.11:2379"],
                                                etcdPrefix="/t/"))
    assert args == {"etcd-servers": "http://10.0.0.11:2379", "etcd-prefix": "/t/"}


def test_extra_args_pass_etcd_flags_k0s_does_not_set_and_cannot_override_its_own() -> None:
    api = {"extraArgs": {"etcd-compaction-interval": "10s", "etcd-prefix": "/other",
                         "etcd-servers": "http://evil:2379", "audit-log-path": "-"}}
    args = crd.crd_apiserver_etcd_args(k0s_yaml(api, endpoints=["https://e:2379"],
                                                etcdPrefix="t", **TLS))
    assert args["etcd-compaction-interval"] == "10s"
    assert args["etcd-prefix"] == "t" and args["etcd-servers"] == "https://e:2379"
    assert "audit-log-path" not in args


@pytest.mark.parametrize(("cfg", "message"), [
    ({"spec": {"storage": {"type": "kine"}}}, "storage.type is 'kine'"),
    (k0s_yaml(etcdPrefix="t"), "no spec.storage.etcd.externalCluster.endpoints"),
    ({}, "no spec.storage.etcd.externalCluster.endpoints"),
])
def test_etcd_args_refuse_what_k0s_would_not_give(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(Exception, match=message.replace(".", r"\.")):
        crd.crd_apiserver_etcd_args(cfg)


def test_sans_from_k0s_yaml_then_extras_deduplicated() -> None:
    cfg = k0s_yaml({"address": "10.0.0.21", "sans": ["10.0.0.21", "10.0.0.30"],
                    "externalAddress": "10.0.0.30"}, endpoints=["x"])
    assert crd.crd_apiserver_sans(cfg, ["10.0.0.21", "ctrl-1", "127.0.0.1", ""]) == [
        "IP:10.0.0.21", "IP:10.0.0.30", "DNS:ctrl-1", "IP:127.0.0.1"]


def test_certificates_one_ca_and_admin_per_tenant_a_serving_cert_per_controller() -> None:
    hosts = [
        {"inventory_hostname": "c1", "k0s_tenant": "a", "node_address": "10.0.0.21",
         "crd_apiserver_k0s_yaml": k0s_yaml({"address": "10.0.0.21", "externalAddress": "10.0.0.30"})},
        {"inventory_hostname": "c2", "k0s_tenant": "a", "node_address": "10.0.0.22"},
        {"inventory_hostname": "c3", "k0s_tenant": "b", "node_address": "10.0.0.23"},
    ]
    certs = crd.crd_apiserver_certificates(hosts, "CA")
    names = [(c["tenant"], c["name"]) for c in certs]
    assert names == [("a", "ca"), ("a", "admin"), ("a", "serving-c1"), ("a", "serving-c2"),
                     ("b", "ca"), ("b", "admin"), ("b", "serving-c3")]
    admin = certs[1]
    assert admin["o"] == ["system:masters"] and admin["eku"] == ["clientAuth"]
    assert "IP:10.0.0.30" in certs[2]["sans"] and "DNS:c1" in certs[2]["sans"]
    assert certs[4]["cn"] != certs[0]["cn"]  # each tenant its own CA


def test_systemd_quote() -> None:
    assert crd.crd_apiserver_systemd_quote('--etcd-prefix=/a b"%') == '"--etcd-prefix=/a b\\"%%"'


def test_up_vars_off_and_k0s_available(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sandboxlib import apiserver
    from sandboxlib.progress import Screen
    from sandboxlib.topology import load

    topo = load("default")
    screen = Screen(io.StringIO(), tty=False)
    assert apiserver.up_vars(topo, {}, "off", screen) == {"crd_apiserver_enabled": False}
    binary = tmp_path / "k0s"
    binary.write_text("")
    monkeypatch.setenv("K0S_BINARY", str(binary))
    assert apiserver.k0s_source(topo, {}).startswith("k0s binary")
    assert apiserver.up_vars(topo, {}, "auto", screen) == {}  # k0s's own: nothing built
    assert "Kubernetes API: k0s's own (k0s binary" in screen.out.getvalue()


def test_up_vars_on_builds_and_reports_a_failed_build(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    from sandboxlib import apiserver
    from sandboxlib.progress import Screen
    from sandboxlib.topology import load

    fake = tmp_path / "build"
    fake.write_text("#!/bin/sh\necho 'build-apiserver: step: build root' >&2\n"
                    "echo 'E: mirror noise' >&2\n"
                    "echo 'build-apiserver: could not build: mirror down' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(apiserver, "BUILD", fake)
    out = io.StringIO()
    log = tmp_path / "up.log"
    with pytest.raises(RuntimeError, match="mirror down"):
        apiserver.up_vars(load("default"), {}, "on", Screen(out, tty=False), log)
    # the build's output went to the log; the screen has the step's two lines
    assert "E: mirror noise" in log.read_text()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[1].startswith("    Kubernetes API stand-in FAILED after"), lines


def test_up_vars_reuses_the_built_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from sandboxlib import apiserver
    from sandboxlib.progress import Screen
    from sandboxlib.topology import load

    fake = tmp_path / "build"
    fake.write_text(f"#!/bin/sh\necho {tmp_path}/kube-abc\n")
    fake.chmod(0o755)
    monkeypatch.setattr(apiserver, "BUILD", fake)
    out = io.StringIO()
    got = apiserver.up_vars(load("default"), {}, "on", Screen(out, tty=False))
    assert got == {"crd_apiserver_dir": f"{tmp_path}/kube-abc"}
    assert "not k0s: from the cache" in out.getvalue()


def test_verify_table(tmp_path: Path) -> None:
    from sandboxlib import report

    path = tmp_path / "verify.json"
    path.write_text(json.dumps({"checks": [
        {"name": "a", "ok": True, "detail": "fine"},
        {"name": "b", "ok": False, "detail": "broken"},
        {"name": "c", "ok": True, "skipped": True, "detail": "SKIPPED: why"}],
        "certificates": [{"file": "/x/ca.crt", "days_left": 3649}]}))
    text = report.verify_table(path)
    lines = text.splitlines()
    assert lines[0].split() == ["RESULT", "CHECK", "DETAIL"]
    assert lines[1].split()[:2] == ["PASS", "a"] and lines[2].split()[:3] == ["FAIL", "b", "broken"]
    assert lines[3].split()[:2] == ["SKIP", "c"]
    assert "1 passed, 1 failed, 1 skipped" in text and "3649 days (ca.crt)" in text
