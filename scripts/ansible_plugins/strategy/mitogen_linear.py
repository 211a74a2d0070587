"""Ansible strategy plugin: Ansible's ``linear`` strategy run by Mitogen for Ansible.

ansible.cfg makes it the project's default strategy (``strategy = mitogen_linear``) for every
entry point that reads that file: ``scripts/sandbox``, ``ansible-playbook`` from the
repository root, Molecule and the Vagrantfile's provisioner. Mitogen (``mitogen`` on PyPI,
pinned in requirements.txt) keeps one Python interpreter per node for a whole playbook run
instead of starting one per task, which is most of a task's cost over SSH and far more under
TCG (docs/performance.md has the figures that adopted it).

This file is what Mitogen's own ``ansible_mitogen/plugins/strategy/mitogen_linear.py`` is: a
subclass of its StrategyMixin and Ansible's linear strategy, found here so that ansible.cfg
needs no path into a virtualenv. Where ``mitogen`` is not installed (an Ansible of the
user's own), it warns once and runs Ansible's plain linear strategy: the same tasks and
results, only slower.

A play that must not run under Mitogen names ``strategy: linear`` (playbooks/nodes.yml's
localhost play: Mitogen's async jobs never finished there).
"""

from __future__ import annotations

from ansible.plugins.loader import strategy_loader
from ansible.utils.display import Display

DOCUMENTATION = r"""
name: mitogen_linear
short_description: Ansible's linear strategy run by Mitogen for Ansible
description:
  - The project's default strategy (ansible.cfg). Without the mitogen package, Ansible's
    linear strategy with a warning.
requirements:
  - mitogen (PyPI), pinned in requirements.txt
"""

try:
    import ansible_mitogen.loaders
    import ansible_mitogen.strategy
except ImportError as exc:  # an Ansible without mitogen: plain linear, said once
    Display().warning(f"mitogen is not installed ({exc}): Ansible's linear strategy runs "
                      "instead (slower; pip install -r requirements.txt adds it)")
    StrategyModule = strategy_loader.get("linear", class_only=True)
else:
    _Linear = ansible_mitogen.loaders.strategy_loader.get("linear", class_only=True)

    class StrategyModule(ansible_mitogen.strategy.StrategyMixin, _Linear):  # type: ignore[no-redef,misc,valid-type]
        """Mitogen's StrategyMixin over Ansible's linear strategy."""
