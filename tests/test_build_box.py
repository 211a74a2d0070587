"""scripts/build-box's own steps that need no image build: arguments and the pruning of
kernel copies left by older recipes (the box's VMs boot from copies in libvirt's boot
directory, one pair per recipe)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from conftest import REPO_ROOT

BUILD_BOX = REPO_ROOT / "scripts" / "build-box"


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BUILD_BOX), *args], capture_output=True, text=True, timeout=60,
                          check=False, env=dict(os.environ, **(env or {})))


def test_unknown_argument_is_refused_with_the_choices() -> None:
    result = run("--frobnicate")
    assert result.returncode == 2
    assert "unknown argument '--frobnicate'" in result.stderr
    assert "--prune" in result.stderr


def test_prune_removes_only_unused_copies_of_other_recipes(tmp_path: Path) -> None:
    current = run("--print-hash").stdout.strip()[:12]
    assert len(current) == 12
    boot = tmp_path / "boot"
    etc_qemu = tmp_path / "etc-qemu"
    run_qemu = tmp_path / "run-qemu"
    for d in (boot, etc_qemu, run_qemu):
        d.mkdir()
    names = {
        "current": [f"k0sbox-{current}-vmlinuz", f"k0sbox-{current}-initrd.img"],
        "old": ["k0sbox-aaaaaaaaaaaa-vmlinuz", "k0sbox-aaaaaaaaaaaa-initrd.img"],
        "in use": ["k0sbox-bbbbbbbbbbbb-vmlinuz", "k0sbox-bbbbbbbbbbbb-initrd.img"],
        "not ours": ["vmlinuz-6.1.0-cloud", "k0sbox-notes.txt"],
    }
    for files in names.values():
        for name in files:
            (boot / name).write_bytes(b"kernel")
    # A running domain still boots from the 'in use' pair.
    (run_qemu / "k0sbox-x-etcd-1.xml").write_text(
        f"<domain><os><kernel>{boot}/k0sbox-bbbbbbbbbbbb-vmlinuz</kernel>"
        f"<initrd>{boot}/k0sbox-bbbbbbbbbbbb-initrd.img</initrd></os></domain>")
    (etc_qemu / "unrelated.xml").write_text("<domain><os><kernel>/boot/vmlinuz</kernel></os></domain>")

    env = {"SANDBOX_LIBVIRT_BOOT_DIR": str(boot),
           "SANDBOX_LIBVIRT_DOMAIN_XML_DIRS": f"{etc_qemu} {run_qemu}"}
    result = run("--prune", env=env)
    assert result.returncode == 0, result.stderr
    left = sorted(p.name for p in boot.iterdir())
    assert left == sorted(names["current"] + names["in use"] + names["not ours"]), left
    assert "removed" in result.stderr and "aaaaaaaaaaaa" in result.stderr
    assert f"kept {boot}/k0sbox-bbbbbbbbbbbb-vmlinuz: a libvirt domain in {run_qemu}" in result.stderr

    # Nothing left to prune: a second run removes nothing.
    again = run("--prune", env=env)
    assert again.returncode == 0
    assert "removed" not in again.stderr
    assert sorted(p.name for p in boot.iterdir()) == left
