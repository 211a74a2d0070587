"""Every filter the collection ships is documented as ansible.builtin and community.crypto
document theirs: ``plugins/filter/<name>.yml`` beside the Python file that holds several
filters (DOCUMENTATION, EXAMPLES, RETURN; ansible-core reads it for ``ansible-doc -t filter``).

The documentation follows the code: its options are the function's parameters in order (the
first is ``_input``, what stands left of the ``|``), required exactly where the parameter has
no default; its example calls the filter by its full name; ``ansible-doc`` renders each.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
COLLECTION = "k0sbox.external_etcd"
sys.path.insert(0, str(REPO / ".collections"))


def shipped_filters() -> dict[str, Any]:
    import importlib

    found: dict[str, Any] = {}
    for path in sorted((REPO / "plugins" / "filter").glob("*.py")):
        module = importlib.import_module(f"ansible_collections.k0sbox.external_etcd.plugins.filter.{path.stem}")
        for name, fn in module.FilterModule().filters().items():
            assert name not in found, f"{name} defined twice"
            found[name] = fn
    return found


FILTERS = shipped_filters()


def test_the_scan_finds_the_filters() -> None:
    """The parametrised checks below cover something (a scan of nothing would pass)."""
    assert {"k0s_install_plan", "pki_sans", "sandbox_tenant_errors"} <= set(FILTERS)
    assert len(FILTERS) > 50


def test_no_documentation_without_its_filter() -> None:
    docs = {p.stem for p in (REPO / "plugins" / "filter").glob("*.yml")}
    assert docs - set(FILTERS) == set(), "documentation of a filter that no longer exists"


@pytest.mark.parametrize("name", sorted(FILTERS))
def test_documented_as_the_function_is(name: str) -> None:
    path = REPO / "plugins" / "filter" / f"{name}.yml"
    assert path.is_file(), f"{name}: no {path.relative_to(REPO)} (DOCUMENTATION, EXAMPLES, RETURN)"
    text = path.read_text(encoding="utf-8")
    assert "TODO" not in text
    data = yaml.safe_load(text)
    assert set(data) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}
    doc = data["DOCUMENTATION"]
    assert doc["name"] == name
    assert doc["short_description"] and not doc["short_description"].endswith(".")
    assert doc["description"]

    params = list(inspect.signature(FILTERS[name]).parameters.values())
    keys = ["_input"] + [p.name for p in params[1:]]
    assert list(doc["options"]) == keys, f"{name}: options must be the parameters {keys} in order"
    assert [k.strip() for k in doc["positional"].split(",")] == keys
    for key, param in zip(keys, params):
        option = doc["options"][key]
        assert option.get("description"), f"{name}: {key} has no description"
        assert option.get("type"), f"{name}: {key} has no type"
        required = param.default is inspect.Parameter.empty
        assert bool(option.get("required", False)) == required, (
            f"{name}: {key} is {'required' if required else 'optional'} in the function")

    assert f"{COLLECTION}.{name}" in data["EXAMPLES"], f"{name}: the example calls it by its full name"
    assert data["RETURN"]["_value"]["description"] and data["RETURN"]["_value"]["type"]


def test_ansible_doc_renders_every_filter() -> None:
    """As a user reads them: ``ansible-doc -t filter`` lists none UNDOCUMENTED and renders each."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    bin_dir = Path(sys.executable).parent
    listed = subprocess.run([str(bin_dir / "ansible-doc"), "-t", "filter", "-l", COLLECTION, "-j"],
                            cwd=REPO, env=env, capture_output=True, text=True, check=True, timeout=120)
    listing = json.loads(listed.stdout)
    names = {k.rsplit(".", 1)[-1]: v for k, v in listing.items()}
    assert set(names) == set(FILTERS)
    assert [n for n, d in names.items() if "UNDOCUMENTED" in str(d)] == []
    shown = subprocess.run([str(bin_dir / "ansible-doc"), "-t", "filter", "-j",
                            *[f"{COLLECTION}.{n}" for n in sorted(FILTERS)]],
                           cwd=REPO, env=env, capture_output=True, text=True, check=True, timeout=120)
    rendered = json.loads(shown.stdout)
    assert len(rendered) == len(FILTERS)
    for full, entry in rendered.items():
        assert entry["doc"]["name"] == full.rsplit(".", 1)[-1]
        assert entry["examples"], full
