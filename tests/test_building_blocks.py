"""Each etcd operation, tenant rule and probe is written once (docs/design.md, "Building
blocks"): no task file, playbook or scenario writes its own copy again.

- the etcd operations (who leads, moving leadership, waiting for health, comparing the
  members' data, promoting a learner) are plugins/modules/sandbox_etcd.py's;
- the tenant rules are plugins/plugin_utils/sandbox_tenants.py's, and the roles read each tenant's
  normalised prefix (``key_prefix``) instead of normalising it again;
- no Python program is embedded in a role's tasks (``python3 -c`` or a heredoc to ``python3 -``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
YAML_DIRS = ("roles", "playbooks", "molecule")


def yaml_files() -> list[Path]:
    return sorted(p for d in YAML_DIRS for p in (REPO / d).rglob("*.yml")
                  if "/files/" not in str(p) and "/templates/" not in str(p))


def tasks_of(data: Any) -> Iterator[dict[str, Any]]:
    """Every task (a mapping with a module or include) in a loaded YAML document."""
    if isinstance(data, list):
        for item in data:
            yield from tasks_of(item)
    elif isinstance(data, dict):
        if "name" in data or "block" in data:
            yield data
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from tasks_of(data.get(key))


def _command(task: dict[str, Any]) -> str:
    for key in ("ansible.builtin.command", "ansible.builtin.shell", "command", "shell"):
        value = task.get(key)
        if isinstance(value, dict):
            return str(value.get("cmd") or value.get("argv") or "")
        if value:
            return str(value)
    return ""


# etcdctl subcommands only sandbox_etcd runs (the reads of test data are not among them).
ETCD_OPERATIONS = re.compile(r"endpoint hashkv|move-leader|member promote")


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_copy_of_an_etcd_operation(path: Path) -> None:
    found = []
    for task in tasks_of(yaml.safe_load(path.read_text())):
        cmd = _command(task)
        if ETCD_OPERATIONS.search(cmd):
            found.append(f"{task.get('name')}: {ETCD_OPERATIONS.search(cmd).group(0)}")  # type: ignore[union-attr]
        if "until" in task and "endpoint health" in cmd:
            found.append(f"{task.get('name')}: a wait for endpoint health")
        if EMBEDDED_PYTHON.search(cmd) and "roles" in path.parts:
            found.append(f"{task.get('name')}: a Python program embedded in a role")
    assert found == [], "use sandbox_etcd (plugins/modules/sandbox_etcd.py) instead"


EMBEDDED_PYTHON = re.compile(r"python3? +-c\b|python3? +- .*<<")


def test_the_embedded_python_check_sees_both_forms() -> None:
    # upgrade/result.yml's wait read /version with this heredoc before ansible.builtin.uri did
    heredoc = "set -a; . /etc/etcd/etcdctl.env; set +a\npython3 - https://m:2379/version <<'PY'\nimport ssl\nPY\n"
    assert EMBEDDED_PYTHON.search(heredoc)
    assert EMBEDDED_PYTHON.search("python3 -c 'import json'")
    assert not EMBEDDED_PYTHON.search("{{ etcd_etcdctl }} endpoint status -w json")


def test_the_scan_sees_tasks() -> None:
    """The check above reads tasks at every depth (a scan of nothing would pass)."""
    tasks = list(tasks_of(yaml.safe_load((REPO / "roles/etcd/tasks/backup/restore_switch.yml").read_text())))
    assert any(t.get("name") == "Wait until every member holds the same data (hashkv at one revision)"
               for t in tasks)
    assert len(yaml_files()) > 100


# The test double of k0s copies kube-apiserver's own normalisation (it stands in for it).
PREFIX_RULE_HOME = {"plugins/plugin_utils/sandbox_tenants.py", "scripts/sandboxlib/sandbox_tenants.py",
                    "tests/k0s-test-double/k0s_double_common.py"}


def test_the_tenant_rules_live_in_one_module() -> None:
    copies = []
    for path in sorted(REPO.glob("**/*.py")):
        rel = str(path.relative_to(REPO))
        if rel.startswith((".venv", "tests/")) or rel in PREFIX_RULE_HOME:
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"""strip\(["']/["']\) \+ ["']/["']|RESERVED_TENANT_NAMES = """, text):
            copies.append(rel)
    assert copies == [], "import plugins/plugin_utils/sandbox_tenants.py instead"
    users = [str(p.relative_to(REPO)) for p in yaml_files() if "k0s_normalize_prefix" in p.read_text()]
    assert users == [], "read the tenant's key_prefix (the inventory normalised it once)"


@pytest.mark.parametrize("path", sorted((REPO / "plugins" / "modules").glob("*.py")),
                         ids=lambda p: p.stem)
def test_module_documentation_is_yaml(path: Path) -> None:
    """ansible-doc and ansible-lint read DOCUMENTATION and RETURN as YAML."""
    import ast

    tree = ast.parse(path.read_text())
    docs = {t.id: n.value.value for n in tree.body if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    assert yaml.safe_load(docs["DOCUMENTATION"])["module"] == path.stem
    assert isinstance(yaml.safe_load(docs["RETURN"]), dict)
