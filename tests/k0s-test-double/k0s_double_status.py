"""The status socket of the k0s test double (not k0s): a running controller answers
GET /status on /run/k0s/status.sock with its K0sStatus as JSON, as k0s's status component
does; `k0s status` and `k0s token create` ask it. See the `k0s` script beside this file."""

import http.client
import http.server
import json
import os
import socket
import socketserver
import threading
from typing import Any, ClassVar

from k0s_double_common import LABEL, MIMICS


def k0s_status(node_config: dict, k0s_vars: dict, args: list[str]) -> dict:
    """The controller's StatusInformation (cmd/controller/controller.go:408-422; the fields of
    K0sStatus, pkg/component/status/client.go:18-36): SysInit and StubFile are never set;
    a controller without --enable-worker has Workloads and SingleNode false. TestDouble is
    the double's label, a field k0s does not have."""
    return {"Version": f"{MIMICS}-test-double", "Pid": os.getpid(), "PPid": os.getppid(),
            "Role": "controller", "SysInit": "", "StubFile": "", "Output": "",
            "Workloads": False, "SingleNode": False, "Args": args,
            "WorkerToAPIConnectionStatus": {"Message": "", "Success": False},
            "ClusterConfig": node_config, "K0sVars": k0s_vars, "TestDouble": LABEL}


class _Handler(http.server.BaseHTTPRequestHandler):
    info: ClassVar[dict] = {}

    def do_GET(self) -> None:
        """statusHandler.ServeHTTP (pkg/component/status/status.go:98-106); /components
        (per-component probes) is not modelled: 404."""
        body, code = json.dumps(self.info).encode(), 200
        if self.path != "/status":
            body, code = b"404 page not found\n", 404
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:
        return "status.sock"

    def log_message(self, fmt: str, *args: Any) -> None:
        pass


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def serve_status(path: str, info: dict) -> _UnixHTTPServer:
    """Status.Start (pkg/component/status/status.go:66-80): listen on the socket, serve in
    the background."""
    if os.path.exists(path):
        os.unlink(path)
    _Handler.info = info
    server = _UnixHTTPServer(path, _Handler)
    os.chmod(path, 0o600)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_status(server: _UnixHTTPServer, path: str) -> None:
    """Status.Stop (status.go:82-91): shut the server down and remove the socket."""
    server.shutdown()
    server.server_close()
    if os.path.exists(path):
        os.unlink(path)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=5)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(5)
        self.sock.connect(self.path)


class StatusError(Exception):
    """GetStatusInfo's error, with k0s's text."""


def status_info(path: str) -> dict:
    """GetStatusInfo (pkg/component/status/client.go:39-80): GET http://localhost/status over
    the socket; an error says "status: can't get "status" via "<socket>": ..."."""
    conn = _UnixConnection(path)
    try:
        conn.request("GET", "/status")
        resp = conn.getresponse()
        body = resp.read()
    except OSError as err:
        reason = "no such file or directory" if isinstance(err, FileNotFoundError) else \
            "connection refused" if isinstance(err, ConnectionRefusedError) else str(err)
        raise StatusError(f'status: can\'t get "status" via "{path}": Get '
                          f'"http://localhost/status": dial unix {path}: connect: {reason}') from err
    finally:
        conn.close()
    if resp.status != 200:
        raise StatusError(f'status: can\'t get "status" via "{path}": status code {resp.status}')
    return json.loads(body)
