"""plugins/filter/sandbox_probe.py: the one "probe once, change only what differs" comparison."""

from __future__ import annotations

from pathlib import Path

from conftest import load_plugin

REPO = Path(__file__).resolve().parents[1]
probe = load_plugin("plugins/filter/sandbox_probe.py")


def test_file_from_src_compares_checksum_mode_and_owner(tmp_path: Path) -> None:
    src = tmp_path / "f"
    src.write_text("x")
    entry = {"dest": "/etc/f", "src": str(src), "owner": "kube-apiserver", "group": "root", "mode": "0600"}
    want = probe.probe_want(entry)
    assert want.endswith(" 600:kube-apiserver:root")
    assert want.startswith("2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881 ")
    assert probe.probe_stale([entry], {"file:/etc/f": want}) == []
    assert probe.probe_stale([entry], {"file:/etc/f": want.replace("600", "640")}) == [entry]
    assert probe.probe_stale([entry], {"file:/etc/f": want.replace(":root", ":etcd")}) == [entry]
    assert probe.probe_stale([entry], {}) == [entry]
    assert probe.probe_want({**entry, "src": str(tmp_path / "missing")}).startswith(" ")


def test_content_and_known_checksum() -> None:
    content = {"dest": "/etc/u", "content": "unit", "owner": "root", "group": "root", "mode": "0644"}
    assert not probe.probe_differs({"file:/etc/u": probe.probe_want(content)}, content)
    assert probe.probe_differs({"file:/etc/u": probe.probe_want({**content, "content": "unit\n"})}, content)
    known = {"dest": "/b", "sha256": "ab" * 32, "owner": "root", "group": "root", "mode": "755"}
    assert probe.probe_want(known) == "ab" * 32 + " 755:root:root"


def test_directory() -> None:
    d = {"dest": "/var/lib/etcd", "state": "directory", "owner": "etcd", "group": "etcd", "mode": "0700"}
    assert probe.probe_want(d) == "dir 700:etcd:etcd"
    assert not probe.probe_differs({"file:/var/lib/etcd": "dir 700:etcd:etcd"}, d)
    assert probe.probe_differs({"file:/var/lib/etcd": "dir 755:etcd:etcd"}, d)
    assert probe.probe_differs({}, d)


def test_a_control_node_file_is_compared_in_process(tmp_path: Path) -> None:
    """roles/crd_apiserver's kubeconfig on the control node: written only where it is
    missing, holds other contents or has another mode."""
    path = tmp_path / "t.yaml"
    assert probe.probe_local_differs(str(path), "a: 1\n", "0600")
    path.write_text("a: 1\n")
    path.chmod(0o600)
    assert not probe.probe_local_differs(str(path), "a: 1\n", "0600")
    assert probe.probe_local_differs(str(path), "a: 2\n", "0600")
    path.chmod(0o644)
    assert probe.probe_local_differs(str(path), "a: 1\n", "0600")
