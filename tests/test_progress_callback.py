"""The sandbox_progress callback plugin's one-line failure reasons."""

from __future__ import annotations

import importlib.util
from types import ModuleType

import pytest
from conftest import REPO_ROOT


def _plugin() -> ModuleType:
    path = REPO_ROOT / "plugins" / "callback" / "sandbox_progress.py"
    spec = importlib.util.spec_from_file_location("sandbox_progress", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("result", "message"), [
    ({"msg": "etcd_members: give at least one member"}, "etcd_members: give at least one member"),
    ({"msg": "non-zero return code", "rc": 3, "stderr": "first\nboom"},
     "non-zero return code: boom (rc 3)"),
    ({"stdout": "a\nlast line", "rc": 1}, "last line (rc 1)"),
    ({}, "failed"),
    ({"msg": "x\n  y   z"}, "x y z"),
    ({"msg": "One or more items failed", "results": [
        {"failed": False, "msg": "fine"},
        {"failed": True, "msg": "Validation of arguments failed: etcd_client_port: abc is not an int"}]},
     "Validation of arguments failed: etcd_client_port: abc is not an int"),
])
def test_failure_message(result: dict[str, object], message: str) -> None:
    assert _plugin().failure_message(result) == message


def test_failure_message_is_bounded() -> None:
    assert len(_plugin().failure_message({"msg": "x" * 5000})) == 400
