"""plugins/module_utils/etcdctl.py: the one etcdctl runner every module uses (sandbox_etcd
through the member's wrapper, sandbox_etcd_prefix with a tenant's connection).

Its argv as etcdctl receives it, then calls to a real etcd member on loopback (etcd and
etcdctl of roles/etcd's pinned Debian packages, as tests/test_sandbox_etcd.py runs them): a
JSON answer, a refusal named by etcdctl's own last line, and a call that never answers ended
at its deadline as rc 124 instead of an exception.
"""

from __future__ import annotations

import base64
import time
from pathlib import Path

import pytest
import test_sandbox_etcd_prefix
from ansible_collections.k0sbox.external_etcd.plugins.module_utils.etcdctl import (
    TIMEOUT_RC,
    Connection,
    Etcdctl,
    EtcdctlError,
)
from conftest import free_ports
from test_sandbox_etcd import Cluster

# The fixture: one healthy etcd member on loopback (tests/test_sandbox_etcd_prefix.py's).
etcd = test_sandbox_etcd_prefix.etcd


def test_the_wrapper_gets_no_connection_flags() -> None:
    """roles/etcd's wrapper holds the endpoints and the admin certificate itself."""
    assert Connection().flags() == []
    assert Etcdctl("/usr/local/bin/etcdctl").argv == ["/usr/local/bin/etcdctl"]


def test_a_tenant_connection_as_etcdctl_flags_after_who_runs_it() -> None:
    params = {"endpoints": ["https://10.0.0.11:2379", "https://10.0.0.12:2379"],
              "cacert": "/var/lib/k0s/pki/etcd/ca.crt", "cert": "/var/lib/k0s/pki/apiserver-etcd-client.crt",
              "key": "/var/lib/k0s/pki/apiserver-etcd-client.key", "run_as": ["ignored"]}
    ctl = Etcdctl("etcdctl", Connection.of(params), run_as=["setpriv", "--reuid=kube-apiserver"],
                  extra=["--dial-timeout=5s"])
    assert ctl.argv == [
        "setpriv", "--reuid=kube-apiserver", "etcdctl",
        "--endpoints=https://10.0.0.11:2379,https://10.0.0.12:2379",
        "--cacert=/var/lib/k0s/pki/etcd/ca.crt", "--cert=/var/lib/k0s/pki/apiserver-etcd-client.crt",
        "--key=/var/lib/k0s/pki/apiserver-etcd-client.key", "--dial-timeout=5s"]
    # plain HTTP: no TLS flag at all (an empty --cacert= would make etcdctl read no file)
    assert Connection.of({"endpoints": ["http://10.0.0.11:2379"], "cacert": "", "cert": None,
                          "key": ""}).flags() == ["--endpoints=http://10.0.0.11:2379"]


def _client(etcd: Cluster, **kw: float) -> Etcdctl:
    return Etcdctl(str(Path(etcd.bindir) / "etcdctl"), Connection(tuple(etcd.client.values())), **kw)


def test_json_answers_and_bytes_on_stdin(etcd: Cluster) -> None:
    ctl = _client(etcd)
    put = ctl.json("put", "/client/a", stdin=b"from stdin \x01\xff")  # the value from stdin
    assert put["header"]["revision"] >= 2
    got = ctl.json("get", "/client/a")
    assert [base64.b64decode(kv["value"]) for kv in got["kvs"]] == [b"from stdin \x01\xff"]
    assert got["header"]["revision"] == put["header"]["revision"]


def test_a_refusal_is_etcdctls_own_last_line(etcd: Cluster) -> None:
    closed = free_ports(1)[0]
    ctl = Etcdctl(str(Path(etcd.bindir) / "etcdctl"), Connection((f"http://127.0.0.1:{closed}",)),
                  extra=["--dial-timeout=1s", "--command-timeout=2s"], timeout=30)
    with pytest.raises(EtcdctlError, match=r"etcdctl 'get': .*(deadline|refused|unavailable)"):
        ctl.json("get", "/client/a")


def test_no_answer_is_rc_124_at_the_deadline_not_an_exception(etcd: Cluster) -> None:
    ctl = _client(etcd, timeout=1.5)
    t0 = time.monotonic()
    res = ctl.call("watch", "/client/never")  # a watch answers only when the key changes
    took = time.monotonic() - t0
    assert res.rc == TIMEOUT_RC, res
    assert res.last_error() == "etcdctl watch /client/never: no answer in 1.5 s"
    assert 1.4 < took < 10
