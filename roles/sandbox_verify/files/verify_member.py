#!/usr/bin/env python3
"""Everything playbooks/verify.yml checks on one etcd member, in one round trip.

usage: verify_member.py SPEC   (SPEC = base64 of a JSON object)
  probes:   [{name, url, expect, ca?, cert?, key?, path?, contains?, tls?, ciphers?, refusal?}]
            -- GET URL/version (or path) the way a client would; a probe that expects a
            refusal passes on the server's own refusal only (see probe());
            cert/key "@other" = the PEM in $VERIFY_OTHER_CERT / $VERIFY_OTHER_KEY (a client
            certificate from another CA, written to a 0600 file in /run and removed after)
  cluster:  ["endpoint health --cluster", ...] -- etcdctl commands run with -w json (the
            first member only), stdout kept as text
  settings: true -- the running etcd's ETCD_* settings (from its unit's EnvironmentFiles:
            /proc/<pid>/environ needs CAP_SYS_PTRACE, which containers lack), its command
            line and "DATADIR <mode> <owner>" of its data dir
  files:    [dir, ...] -- "<d|f> <path> <mode> <owner>:<group>" of each directory and its files
  version:  true -- `--version` of the binary the etcd unit starts
Prints {"probes": [{name, expect, ok, detail}], "cluster": [str], "settings": [str],
"files": [str], "version": str}.
"""

import base64
import grp
import http.client
import json
import os
import pwd
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import warnings

# ssl.TLSVersion.TLSv1/TLSv1_1 warn as deprecated; over SSH (a PTY) stderr lands in stdout,
# which must stay one JSON document.
warnings.filterwarnings("ignore", category=DeprecationWarning)


# The reason OpenSSL gives to an alert the server sent (ssl/ssl_err.c: SSL_AD_REASON_OFFSET +
# the alert's code): SSLV3_ALERT_BAD_CERTIFICATE, TLSV1_ALERT_UNKNOWN_CA,
# TLSV13_ALERT_CERTIFICATE_REQUIRED, ... A failure of the client's own (its verification of
# the server's certificate, a reply that is no TLS, a closed connection) has another reason.
SERVER_ALERT = re.compile(r"^(?:SSLV3|TLSV1|TLSV13)_ALERT_([A-Z0-9_]+)$")
# What Go's net/http answers to plain HTTP on a TLS listener it serves itself (server.go); etcd
# 3.4/3.5 do the handshake in their own listener and close the connection without a word.
GO_PLAIN_HTTP_ON_TLS = "Client sent an HTTP request to an HTTPS server"


def _failure(exc: BaseException) -> BaseException:
    """The error itself, out of urllib's URLError wrapper."""
    reason = getattr(exc, "reason", None)
    return reason if isinstance(exc, urllib.error.URLError) and isinstance(reason, BaseException) else exc


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _speaks_tls(url: str, ca: str | None) -> str | None:
    """How the port of ``url`` answers a TLS ClientHello offering no client certificate: the
    protocol and the server's certificate where the handshake completes with a certificate
    ``ca`` signed for the URL's host (TLS 1.3: the client's side completes before the server
    asks for the client's certificate), the alert where the server refuses the handshake
    (TLS 1.2 asks for it inside), None where the port speaks no TLS or another CA's."""
    if not ca:
        return None
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or 80
    try:
        ctx = ssl.create_default_context(cafile=ca)
        with socket.create_connection((host, port), timeout=5) as sock, \
                ctx.wrap_socket(sock, server_hostname=host) as tls:
            cert = tls.getpeercert() or {}
            subject = ", ".join(f"{k}={v}" for rdn in cert.get("subject", ()) for k, v in rdn)
            return f"{tls.version()}, certificate {subject} of {os.path.basename(ca)}"
    except ssl.SSLError as exc:
        return f"TLS alert {exc.reason}" if SERVER_ALERT.match(exc.reason or "") else None
    except (OSError, ValueError):
        return None


def _tls_verdict(url: str, ctx: ssl.SSLContext) -> BaseException | None:
    """The server's verdict on the client's handshake, read before the client sends a byte:
    the error (its TLS alert, or what else happened) where it refused or the connection
    failed, None where it waits for the request (it accepted). In TLS 1.3 the client's side of
    the handshake completes before the server checks the client's certificate; its alert
    follows, and a request sent meanwhile can make the server's kernel reset the connection
    and drop the alert unread (an EOF instead: seen on a podman node, 2026-12-07). So the
    client first waits for that verdict, as a client with nothing to say yet."""
    parts = urllib.parse.urlsplit(url)
    host, port = parts.hostname or "", parts.port or 443
    try:
        with socket.create_connection((host, port), timeout=5) as sock, \
                ctx.wrap_socket(sock, server_hostname=host) as tls:
            tls.settimeout(3)
            try:
                data = tls.recv(1)
            except (socket.timeout, TimeoutError):
                return None
            return ConnectionResetError(f"the server closed the connection without an alert ({data!r})")
    except (ssl.SSLError, OSError) as exc:
        return exc


def _refused(p: dict, err: BaseException, expected: str) -> tuple[bool | None, str]:
    """Whether ``err`` is the server's refusal the probe expects: ``(False, "refused: ...")``,
    else ``(None, why not)``: a failure that is not the server's refusal is no refusal."""
    failure = _describe(err)
    alert = SERVER_ALERT.match(err.reason or "") if isinstance(err, ssl.SSLError) else None
    if p["url"].startswith("http://"):
        # a TLS port closes a plain-HTTP request without an answer; a port that closes
        # everything, speaks something else or nothing does too, so the port must be shown
        # to speak TLS with the member's certificate
        if isinstance(err, ConnectionResetError):   # http.client.RemoteDisconnected is one
            tls = _speaks_tls(p["url"], p.get("ca"))
            if tls:
                return False, f"refused: {failure} (the port speaks TLS only: {tls})"
            return None, (f"not refused by the server as expected ({expected}): {failure}, "
                          f"and the port completes no TLS handshake with {p.get('ca') or 'no CA given'}")
    elif alert and alert.group(1) in p.get("refusal", []):
        return False, f"refused: {err.reason}"
    return None, f"not refused by the server as expected ({expected}): {failure}"


def probe(p: dict, other: dict) -> dict:
    """GET url + path (default /version, must contain `contains`) as a client would.

    ok: True, answered (HTTP 200 with `contains` for a probe that expects an answer; any HTTP
    answer for one that expects a refusal); False, not answered: for a probe that expects a
    refusal (expect false) only the server's own refusal, as `refusal` names it -- the TLS
    alert the server sends (a list of alert names: CERTIFICATE_REQUIRED, UNKNOWN_CA,
    BAD_CERTIFICATE, PROTOCOL_VERSION, HANDSHAKE_FAILURE, ...); for an http:// URL the
    connection closed without an answer by a port that completes a TLS handshake with a
    certificate of `ca` (or Go's "400 Client sent an HTTP request to an HTTPS server");
    None, neither answered nor refused (the check fails whatever it expects): the client's
    files missing, nothing listening, a timeout, a reply that is no TLS, a handshake the
    client gave up, a connection closed by a port that speaks no TLS.

    tls: "1.1" offers only TLS 1.0-1.1 (OpenSSL's own floor lowered, so the refusal is the
    server's); ciphers: an OpenSSL cipher list for TLS 1.2.
    """
    url = p["url"]
    refusal = p.get("refusal") or []
    p = {**p, "refusal": [refusal] if isinstance(refusal, str) else list(refusal)}
    expected = ("the connection closed by a TLS port" if url.startswith("http://")
                else " or ".join(p["refusal"]) or "no refusal named")
    ctx = None
    if url.startswith("https://"):
        try:
            ctx = ssl.create_default_context(cafile=p.get("ca"))
            if p.get("cert"):
                ctx.load_cert_chain(other.get(p["cert"], p["cert"]), other.get(p["key"], p["key"]))
        except (OSError, ssl.SSLError) as exc:
            # neither answered nor refused: the check fails whatever it expects (ok None)
            files = [f for f in (p.get("ca"), other.get(p.get("cert"), p.get("cert")),
                                 other.get(p.get("key"), p.get("key"))) if f]
            return {"name": p["name"], "expect": p["expect"], "ok": None,
                    "detail": f"not probed: the client's files ({', '.join(files)}): {exc}"}
        if p.get("tls") == "1.1":
            ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
            ctx.minimum_version = ssl.TLSVersion.TLSv1
            ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        if p.get("ciphers"):
            ctx.set_ciphers(p["ciphers"])
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    path, contains = p.get("path", "/version"), p.get("contains", "etcdserver")
    ok: bool | None
    if ctx is not None and not p["expect"]:
        verdict = _tls_verdict(url, ctx)
        if verdict is not None:
            ok, detail = _refused(p, verdict, expected)
            return {"name": p["name"], "expect": p["expect"], "ok": ok, "detail": detail}
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=5, context=ctx) as resp:
            body = resp.read(2_000_000).decode(errors="replace")
            ok = resp.status == 200 and contains in body
            detail = f"HTTP {resp.status} " + (body.strip()[:200] if len(body) <= 200 else
                                               f"{len(body)} bytes" + (f", with {contains}"
                                                                       if ok else ""))
            if not p["expect"]:
                ok = True   # an answer, whatever it says
    except urllib.error.HTTPError as exc:
        # an HTTP answer with an error status: not the answer a probe expecting one wants
        # (False), but an answer where a refusal was expected (True)
        body = exc.read(2000).decode(errors="replace").strip()
        ok, detail = not p["expect"], f"HTTP {exc.code} {body[:200]}"
        if not p["expect"] and exc.code == 400 and GO_PLAIN_HTTP_ON_TLS in body:
            ok, detail = False, f"refused: {detail}"
    except (urllib.error.URLError, ssl.SSLError, ConnectionError, OSError, http.client.HTTPException) as exc:
        err = _failure(exc)
        if p["expect"]:
            ok, detail = False, f"refused: {_describe(err)}"
        else:
            ok, detail = _refused(p, err, expected)
    return {"name": p["name"], "expect": p["expect"], "ok": ok, "detail": detail}


def run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return done.stdout.strip()


def settings() -> list[str]:
    files = re.sub(r" \(ignore_errors=[a-z]+\)", "",
                   run(["systemctl", "show", "-p", "EnvironmentFiles", "--value", "etcd"])).split()
    lines: list[str] = []
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                lines += [ln.rstrip("\n") for ln in fh if ln.startswith("ETCD_")]
        except OSError:
            pass
    pid = run(["systemctl", "show", "-p", "MainPID", "--value", "etcd"])
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            lines.append(fh.read().replace(b"\0", b" ").decode(errors="replace").strip())
    except OSError:
        lines.append("")
    data_dir = ([ln.split("=", 1)[1] for ln in lines if ln.startswith("ETCD_DATA_DIR=")]
                or ["/var/lib/etcd"])[-1]
    try:
        st = os.stat(data_dir)
        lines.append(f"DATADIR {st.st_mode & 0o7777:o} {pwd.getpwuid(st.st_uid).pw_name}")
    except (OSError, KeyError) as exc:
        lines.append(f"DATADIR missing ({exc})")
    return lines


def version() -> str:
    """``--version`` of the binary the etcd unit starts (its ExecStart path): the version
    and, for the sandbox's patched build, the patches (its Git SHA line)."""
    start = run(["systemctl", "show", "-p", "ExecStart", "--value", "etcd"])
    found = re.search(r"path=([^ ;]+)", start)
    return run([found.group(1) if found else "etcd", "--version"])


def files(dirs: list[str]) -> list[str]:
    """'<path> <mode> <owner>:<group>' of each directory in ``dirs`` that exists and of every
    file in it (not recursive)."""
    lines: list[str] = []
    for d in dirs:
        if not os.path.isdir(d):
            continue
        for path in [d] + sorted(os.path.join(d, n) for n in os.listdir(d)):
            try:
                st = os.lstat(path)
                owner = pwd.getpwuid(st.st_uid).pw_name
                group = grp.getgrgid(st.st_gid).gr_name
            except (OSError, KeyError):
                continue
            kind = "d" if os.path.isdir(path) else "f"
            lines.append(f"{kind} {path} {st.st_mode & 0o7777:04o} {owner}:{group}")
    return lines


def cluster(command: str) -> str:
    """etcdctl COMMAND -w json, stdout as text (the data comparison is not asked here: it is
    sandbox_etcd's data_equal, hashkv at one revision, in tasks/members.yml)."""
    return run(["etcdctl", *command.split(), "-w", "json"])


def main() -> int:
    spec = json.loads(base64.b64decode(sys.argv[1]))
    out: dict = {"probes": [], "cluster": [], "settings": []}
    with tempfile.TemporaryDirectory(dir="/run" if os.path.isdir("/run") else None) as tmp:
        other = {}
        for name, var in (("@other-cert", "VERIFY_OTHER_CERT"), ("@other-key", "VERIFY_OTHER_KEY")):
            if os.environ.get(var):
                path = os.path.join(tmp, name.strip("@"))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "w") as fh:
                    fh.write(os.environ[var])
                other[name] = path
        out["probes"] = [probe(p, other) for p in spec.get("probes", [])]
    out["cluster"] = [cluster(c) for c in spec.get("cluster", [])]
    if spec.get("settings"):
        out["settings"] = settings()
    out["files"] = files(spec.get("files", []))
    if spec.get("version"):
        out["version"] = version()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
