"""etcdctl as every module of the collection runs it: one argv (who runs it, the binary, the
connection), one call with a deadline. A call that does not answer in time is an answer
(rc 124, as timeout(1) reports it), never an exception, so a wait can go on polling.

The connection is either the member's wrapper (roles/etcd's ``etcd_etcdctl``: it holds the
member's endpoints and the admin certificate, so nothing is passed) or a tenant's, the four
values of k0s's ``spec.storage.etcd.externalCluster`` (endpoints, caFile, clientCertFile,
clientKeyFile) as etcdctl's flags.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

TIMEOUT_RC = 124


class EtcdctlError(Exception):
    """etcdctl exited non-zero: the message is its last line of stderr."""


@dataclass(frozen=True)
class Connection:
    """Where etcdctl connects and with which certificates (empty: the wrapper's own)."""

    endpoints: tuple[str, ...] = ()
    cacert: str = ""
    cert: str = ""
    key: str = ""

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> Connection:
        """From a module's ``endpoints``, ``cacert``, ``cert`` and ``key`` options."""
        return cls(tuple(params.get("endpoints") or ()), params.get("cacert") or "",
                   params.get("cert") or "", params.get("key") or "")

    def flags(self) -> list[str]:
        out = [f"--endpoints={','.join(self.endpoints)}"] if self.endpoints else []
        return out + [f"--{name}={value}" for name, value in
                      (("cacert", self.cacert), ("cert", self.cert), ("key", self.key)) if value]


@dataclass(frozen=True)
class Result:
    rc: int
    stdout: bytes
    stderr: str

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", errors="replace")

    def last_error(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else f"rc {self.rc}"


class Etcdctl:
    """One etcdctl: ``run_as`` (e.g. setpriv as the tenant's user), the binary, the connection,
    then ``extra`` flags before each call's arguments."""

    def __init__(self, binary: str, connection: Connection = Connection(),
                 run_as: Sequence[str] = (), extra: Sequence[str] = (), timeout: float = 60) -> None:
        self.argv: list[str | bytes] = [*run_as, binary, *connection.flags(), *extra]
        self.timeout = timeout

    def call(self, *args: str | bytes, stdin: bytes = b"") -> Result:
        """etcdctl's answer; rc 124 when there was none within the timeout."""
        try:
            done = subprocess.run([*self.argv, *args], input=stdin, capture_output=True,
                                  timeout=self.timeout, check=False,
                                  env={**os.environ, "ETCDCTL_API": "3"})
        except subprocess.TimeoutExpired:
            shown = " ".join(a.decode(errors="replace") if isinstance(a, bytes) else a for a in args)
            return Result(TIMEOUT_RC, b"", f"etcdctl {shown}: no answer in {self.timeout:g} s")
        return Result(done.returncode, done.stdout, done.stderr.decode("utf-8", errors="replace"))

    def json(self, *args: str | bytes, stdin: bytes = b"") -> Any:
        """etcdctl's ``-w json`` answer, parsed; EtcdctlError when it failed."""
        res = self.call(*args, "-w", "json", stdin=stdin)
        if res.rc != 0:
            first = args[0] if args else b""
            name = first.decode(errors="replace") if isinstance(first, bytes) else first
            raise EtcdctlError(f"etcdctl {name!r}: {res.last_error()}")
        return json.loads(res.stdout or b"{}")
