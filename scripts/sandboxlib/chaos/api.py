"""The Kubernetes API side of the chaos workload, from this host with the tenant's admin
kubeconfig (``scripts/sandbox kubeconfig --tenant T``): custom resources of a CRD of the run's
own (``chaosregisters.chaos.sandbox``, cluster-scoped) created, read, updated with a
resourceVersion precondition and deleted, and a watch through EACH of the tenant's API servers
from a known resourceVersion. Where k0s cannot run, those API servers are Kubernetes' CRD API
server (the stand-in, not k0s): the storage contract is Kubernetes' own code either way.

Plain HTTPS with the standard library (``http.client``): the REST calls are few and shown
as they are; no Kubernetes client library is needed for them.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

GROUP = "chaos.sandbox"
PLURAL = "chaosregisters"
CRD_NAME = f"{PLURAL}.{GROUP}"
RESOURCE = f"/apis/{GROUP}/v1/{PLURAL}"
CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/managed-by": "sandbox-chaos"}},
    "spec": {"group": GROUP, "scope": "Cluster",
             "names": {"plural": PLURAL, "singular": "chaosregister", "kind": "ChaosRegister"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                 "openAPIV3Schema": {"type": "object", "properties": {"spec": {
                     "type": "object", "properties": {"value": {"type": "string"}}}}}}}]},
}
TIMEOUT = 10.0


class ApiError(RuntimeError):
    """The API could not be set up for the run (one line)."""


@dataclass
class Endpoint:
    """Where and how to reach one API server: the URL and a TLS context with the
    kubeconfig's CA and client certificate."""

    server: str
    context: ssl.SSLContext | None

    def connect(self, timeout: float = TIMEOUT) -> http.client.HTTPConnection:
        u = urlsplit(self.server)
        if u.scheme == "https":
            return http.client.HTTPSConnection(u.hostname or "", u.port or 443, timeout=timeout,
                                               context=self.context)
        return http.client.HTTPConnection(u.hostname or "", u.port or 80, timeout=timeout)

    def at(self, host: str) -> Endpoint:
        """The same credentials against another API server of the tenant."""
        u = urlsplit(self.server)
        return Endpoint(f"{u.scheme}://{host}:{u.port or 6443}", self.context)


def endpoint(kubeconfig: Path, workdir: Path) -> Endpoint:
    """An Endpoint from a kubeconfig (inline ``*-data`` or file paths)."""
    cfg = yaml.safe_load(kubeconfig.read_text()) or {}
    try:
        cluster = cfg["clusters"][0]["cluster"]
        user = cfg["users"][0]["user"]
    except (KeyError, IndexError, TypeError):
        raise ApiError(f"{kubeconfig}: no clusters[0].cluster or users[0].user") from None
    server = str(cluster["server"])
    if not server.startswith("https://"):
        return Endpoint(server, None)

    def material(name: str, suffix: str) -> str | None:
        if user.get(f"{name}-data") or cluster.get(f"{name}-data"):
            data = base64.b64decode(user.get(f"{name}-data") or cluster.get(f"{name}-data"))
            path = workdir / f"{kubeconfig.stem}.{suffix}"
            path.touch(mode=0o600)
            path.write_bytes(data)
            return str(path)
        found = user.get(name) or cluster.get(name)
        return str(found) if found else None

    ctx = ssl.create_default_context(cafile=material("certificate-authority", "ca.crt"))
    cert, key = material("client-certificate", "crt"), material("client-key", "key")
    if cert and key:
        ctx.load_cert_chain(cert, key)
    return Endpoint(server, ctx)


def call(ep: Endpoint, method: str, path: str, body: Any = None,
         timeout: float = TIMEOUT) -> tuple[int, dict[str, Any]]:
    """One request; (status, JSON body). Raises OSError / http.client errors on no answer."""
    conn = ep.connect(timeout)
    try:
        data = None if body is None else json.dumps(body)
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            out = json.loads(raw) if raw else {}
        except ValueError:
            out = {"raw": raw[:200].decode(errors="replace")}
        return resp.status, out if isinstance(out, dict) else {}
    finally:
        conn.close()


def ensure_crd(ep: Endpoint, deadline: float) -> None:
    """The run's CRD, created when missing and awaited until established and served."""
    last = ""
    while time.time() < deadline:
        try:
            status, out = call(ep, "GET", f"/apis/apiextensions.k8s.io/v1/"
                                          f"customresourcedefinitions/{CRD_NAME}")
            if status == 404:
                status, out = call(ep, "POST", "/apis/apiextensions.k8s.io/v1/"
                                               "customresourcedefinitions", CRD)
            conds = (out.get("status") or {}).get("conditions") or []
            established = any(c.get("type") == "Established" and c.get("status") == "True"
                              for c in conds)
            if established and call(ep, "GET", RESOURCE)[0] == 200:
                return
            last = f"HTTP {status}: {str(out.get('message', ''))[:120]}"
        except (OSError, http.client.HTTPException) as exc:
            last = str(exc)
        time.sleep(1)
    raise ApiError(f"the CRD {CRD_NAME} was not established in time at {ep.server} ({last})")


def rv(obj: dict[str, Any]) -> int | None:
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    return int(raw) if raw and str(raw).isdigit() else None


def body(name: str, value: str, version: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if version is not None:
        meta["resourceVersion"] = str(version)
    return {"apiVersion": f"{GROUP}/v1", "kind": "ChaosRegister", "metadata": meta,
            "spec": {"value": value}}


def run_op(ep: Endpoint, kind: str, name: str, value: str | None = None,
           expected: int | None = None) -> tuple[str, dict[str, Any], str]:
    """One operation: (outcome, result, error), in the history's terms (history.py)."""
    path = f"{RESOURCE}/{name}"
    try:
        if kind == "create":
            status, out = call(ep, "POST", RESOURCE, body(name, str(value)))
            if status == 201:
                return "ok", {"rev": rv(out)}, ""
            if status == 409:
                return "ok", {"exists": True}, ""
        elif kind == "read":
            status, out = call(ep, "GET", path)
            if status == 200:
                return "ok", {"found": True, "value": (out.get("spec") or {}).get("value"),
                              "rev": rv(out)}, ""
            if status == 404:
                return "ok", {"found": False}, ""
            return "fail", {}, f"HTTP {status}: {str(out.get('message', ''))[:200]}"
        elif kind == "cas":
            status, out = call(ep, "PUT", path, body(name, str(value), expected))
            if status == 200:
                return "ok", {"succeeded": True, "rev": rv(out)}, ""
            if status == 409:
                return "ok", {"succeeded": False}, ""
            if status == 404:
                return "ok", {"succeeded": False, "found": False}, ""
        else:
            status, out = call(ep, "DELETE", path)
            if status in (200, 202):
                return "ok", {"deleted": 1}, ""
            if status == 404:
                return "ok", {"deleted": 0}, ""
        msg = f"HTTP {status}: {str(out.get('message', ''))[:200]}"
        # Refused before storage was touched (bad request, not allowed): certainly no effect.
        return ("fail" if status in (400, 401, 403, 405, 415, 422) else "unknown"), {}, msg
    except (OSError, http.client.HTTPException) as exc:
        return ("fail" if kind == "read" else "unknown"), {}, f"{type(exc).__name__}: {exc}"


class ApiWatch:
    """A watch on the run's resources through one API server, from a known resourceVersion,
    resumed from the last one it saw after a broken stream; a 410 Expired is recorded as a
    reported gap up to the version of a new list."""

    def __init__(self, ep: Endpoint, start: int, emit: Callable[[dict[str, Any]], None],
                 now: Callable[[], float], stop: threading.Event) -> None:
        self.ep, self.rv, self.emit, self.now, self.stop = ep, start, emit, now, stop
        self.last = start

    def run(self, deadline: float, max_restarts: int = 200) -> None:
        restarts = 0
        while not self.stop.is_set() and time.time() < deadline and restarts < max_restarts:
            reason = self.stream(deadline)
            if self.stop.is_set():
                return
            restarts += 1
            self.emit({"type": "restart", "t": self.now(), "from": self.rv, "reason": reason})
            self.stop.wait(1.0)

    def stream(self, deadline: float) -> str:
        try:
            conn = self.ep.connect(timeout=15)
            conn.request("GET", f"{RESOURCE}?watch=1&resourceVersion={self.rv}",
                         headers={"Accept": "application/json"})
            resp = conn.getresponse()
            if resp.status == 410:
                return self.expired()
            if resp.status != 200:
                return f"HTTP {resp.status}"
            while not self.stop.is_set() and time.time() < deadline:
                line = resp.readline()
                if not line:
                    return "stream ended"
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        return self.expired()
                    return f"ERROR {obj.get('message', '')}"[:200]
                version = rv(obj)
                if version is None or ev.get("type") == "BOOKMARK":
                    continue
                # A DELETED event carries the object as it was, at the delete's revision:
                # its value is not a write at that revision.
                value = (None if ev.get("type") == "DELETED"
                         else (obj.get("spec") or {}).get("value"))
                self.emit({"type": "event", "key": (obj.get("metadata") or {}).get("name", "?"),
                           "rev": version, "event": ev.get("type"), "t": self.now(),
                           "value": value})
                self.rv = self.last = max(self.last, version)
            return "stopped"
        except (OSError, ValueError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"[:200]

    def expired(self) -> str:
        try:
            status, out = call(self.ep, "GET", RESOURCE)
        except (OSError, http.client.HTTPException) as exc:
            return f"410 Expired, then no list: {exc}"
        now = rv(out) if status == 200 else None
        if now is None:
            return f"410 Expired, then list HTTP {status}"
        self.emit({"type": "gap", "from": self.rv + 1, "to": now, "why": "410 Expired"})
        self.rv = self.last = now
        return "410 Expired (resumed after a new list)"


def client_loop(ep: Endpoint, names: list[str], rng: random.Random, value_of: Callable[[], str],
                record: Callable[..., None], stop: threading.Event, pace: float) -> None:
    """One API client: create / get / update (resourceVersion precondition) / delete on
    the run's resources until ``stop``; each operation goes to ``record``."""
    seen: dict[str, int | None] = {}
    while not stop.is_set():
        name = rng.choice(names)
        roll = rng.random()
        expected = None
        if roll < 0.25:
            kind, value = "create", value_of()
        elif roll < 0.55:
            kind, value = "read", None
        elif roll < 0.90 and seen.get(name) is None:
            kind, value = "read", None          # learn the resourceVersion first
        elif roll < 0.90:
            kind, value, expected = "cas", value_of(), seen.get(name)
        else:
            kind, value = "delete", None
        t0 = time.monotonic()
        outcome, result, error = run_op(ep, kind, name, value, expected)
        record(kind, name, value, expected, t0, time.monotonic(), outcome, result, error)
        if outcome == "ok":
            if result.get("found") is False or result.get("deleted"):
                seen[name] = None
            elif result.get("rev"):
                seen[name] = int(result["rev"])
        else:
            stop.wait(rng.uniform(0.5, 1.0))
        stop.wait(pace)


def tls_workdir() -> tempfile.TemporaryDirectory[str]:
    """A private directory for the kubeconfigs' certificate files during the run."""
    return tempfile.TemporaryDirectory(prefix="sandbox-chaos-")

