"""Mitogen for Ansible as the project's strategy (ansible.cfg, scripts/ansible_plugins/strategy/mitogen_linear.py).

What is checked as Ansible sees it: the configuration every entry point reads names the
strategy; a playbook run from the repository root really runs its tasks under Mitogen (a
task's parent process is Mitogen's context, not an AnsiballZ wrapper); where mitogen is not
installed the plugin falls back to Ansible's linear strategy and says so; and the one play
that must not run under Mitogen (the async node start) names its own strategy.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO_ROOT, explain

BIN = Path(sys.executable).parent
PLUGIN = REPO_ROOT / "scripts" / "ansible_plugins" / "strategy" / "mitogen_linear.py"


def ansible_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    return env | {"ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg")} | extra


def test_ansible_cfg_names_the_mitogen_strategy_and_its_path() -> None:
    res = subprocess.run([str(BIN / "ansible-config"), "dump", "--only-changed", "--format", "json"],
                         cwd=REPO_ROOT, env=ansible_env(), capture_output=True, text=True,
                         check=False, timeout=120)
    assert res.returncode == 0, explain(res)
    seen = {item["name"]: item["value"] for item in json.loads(res.stdout) if "name" in item}
    assert seen["DEFAULT_STRATEGY"] == "mitogen_linear"
    assert seen["DEFAULT_STRATEGY_PLUGIN_PATH"] == [str(REPO_ROOT / "scripts" / "ansible_plugins" / "strategy")]


def _parents(tmp_path: Path, **env: str) -> list[str]:
    """The command lines of a shell task's parent and grandparent, from a real run."""
    playbook = tmp_path / "who-runs-tasks.yml"
    playbook.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Who started this shell",
                   "ansible.builtin.shell": "ps -ww -o args= -p $PPID",
                   "register": "who", "changed_when": False},
                  {"ansible.builtin.debug": {"msg": "PARENT={{ who.stdout }}"}}]}]))
    res = subprocess.run([str(BIN / "ansible-playbook"), str(playbook)], cwd=REPO_ROOT,
                         env=ansible_env(**env), capture_output=True, text=True, check=False,
                         timeout=300)
    assert res.returncode == 0, explain(res)
    return [ln.split("PARENT=", 1)[1] for ln in res.stdout.splitlines() if "PARENT=" in ln]


def test_a_playbook_from_the_repository_root_runs_its_tasks_under_mitogen(tmp_path: Path) -> None:
    parent = _parents(tmp_path)
    assert len(parent) == 1 and "(mitogen:" in parent[0], parent
    # The same playbook with Ansible's own strategy: the parent is AnsiballZ's wrapper, so the
    # assertion above can tell the two apart.
    plain = _parents(tmp_path, ANSIBLE_STRATEGY="linear")
    assert len(plain) == 1 and "mitogen" not in plain[0] and "AnsiballZ" in plain[0], plain


def test_without_mitogen_the_plugin_is_ansibles_linear_strategy_with_a_warning() -> None:
    probe = (
        "import sys, importlib.util\n"
        "sys.modules['ansible_mitogen'] = None  # as if mitogen were not installed\n"
        f"spec = importlib.util.spec_from_file_location('probe_strategy', {str(PLUGIN)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "from ansible.plugins.strategy.linear import StrategyModule as Linear\n"
        "print('LINEAR' if mod.StrategyModule is Linear else mod.StrategyModule.__mro__)\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=False, timeout=120)
    assert res.returncode == 0, explain(res)
    assert res.stdout.strip().splitlines()[-1] == "LINEAR", explain(res)
    assert "mitogen is not installed" in res.stderr + res.stdout, explain(res)


def test_with_mitogen_the_plugin_is_mitogens_mixin_over_linear() -> None:
    probe = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('probe_strategy', {str(PLUGIN)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "print(' '.join(c.__module__ + '.' + c.__name__ for c in mod.StrategyModule.__mro__))\n")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=False, timeout=120)
    assert res.returncode == 0, explain(res)
    mro = res.stdout.split()
    assert "ansible_mitogen.strategy.StrategyMixin" in mro, mro
    assert "ansible.plugins.strategy.linear.StrategyModule" in mro, mro


def test_the_async_node_start_play_keeps_ansibles_linear_strategy() -> None:
    plays = yaml.safe_load((REPO_ROOT / "playbooks" / "nodes.yml").read_text())
    starts = [p for p in plays if p.get("hosts") == "localhost"]
    assert starts and all(p.get("strategy") == "linear" for p in starts), starts
    tasks = (REPO_ROOT / "roles" / "podman_nodes" / "tasks" / "start.yml").read_text()
    assert "async:" in tasks   # the reason: if the async start goes, so can this exception
