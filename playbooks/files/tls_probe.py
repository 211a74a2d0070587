#!/usr/bin/env python3
"""Probe an etcd client URL the way a client would, and report what happened as JSON.

usage: tls_probe.py URL [--ca FILE] [--cert FILE --key FILE]
Prints {"ok": bool, "detail": str}: ok means GET /version answered 200 with etcd's version.
Used by playbooks/verify.yml: a client with no certificate, with a certificate from another
CA, and plain http:// must all be refused by a TLS member; the admin certificate must work.
"""

import json
import ssl
import sys
import urllib.error
import urllib.request


def main() -> int:
    args = sys.argv[1:]
    url = args[0]
    opts = dict(zip(args[1::2], args[2::2]))
    ctx = None
    if url.startswith("https://"):
        ctx = ssl.create_default_context(cafile=opts.get("--ca"))
        if "--cert" in opts:
            ctx.load_cert_chain(opts["--cert"], opts["--key"])
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/version", timeout=5, context=ctx) as resp:
            body = resp.read(200).decode(errors="replace")
            ok = resp.status == 200 and "etcdserver" in body
            result = {"ok": ok, "detail": f"HTTP {resp.status} {body.strip()}"}
    except (urllib.error.URLError, ssl.SSLError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        result = {"ok": False, "detail": f"refused: {type(reason).__name__}: {reason}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
