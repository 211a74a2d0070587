#!/usr/bin/env python3
"""A watching client as client-go's reflector is, in miniature, on this host with the tenant's
kubeconfig (for k0s_tenants' restore; the API server is the CRD API server stand-in, not k0s).

It watches PATH from resourceVersion RV. When a stream ends it resumes from the last version it
saw, as a reflector does (connection refused or an answer other than 200: again after 0.2 s,
a client's back-off). When the API server says the version is gone (410, an HTTP status or an
ERROR event) it relists and stops. One JSON line per step in OUT, each with "t" (epoch seconds):
  {"step": "watching", "rv"}   a stream open (HTTP 200)
  {"step": "event", "type", "name" | "code", "reason", "message", "rv"}
  {"step": "ended", "stream", "events", "how", "rv"}   how a stream ended
  {"step": "refused", "rv", "status" | "error", "body"}   a resume that got no stream
  {"step": "relist", "rv", "objects": ["name=size=uid", ...]}   then "done"
Gives up at the deadline (seconds from the start) with {"step": "deadline"}.

usage: reflector.py OUT KUBECONFIG PATH RV DEADLINE
"""

import base64
import http.client
import json
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import yaml


def connect(server: str, ctx: ssl.SSLContext, url: str) -> http.client.HTTPResponse:
    split = urlsplit(server)
    conn = http.client.HTTPSConnection(split.hostname or "", split.port or 443, context=ctx, timeout=5)
    conn.request("GET", url)
    resp = conn.getresponse()
    if conn.sock is not None:
        conn.sock.settimeout(150)  # a stream lasts timeoutSeconds=120 at most
    return resp


def watch(out: TextIO, server: str, ctx: ssl.SSLContext, path: str, rv: str, end: float) -> bool:
    """Watch and resume until the version is gone (True) or the deadline (False)."""
    def note(**step: Any) -> None:
        out.write(json.dumps({**step, "t": round(time.time(), 2)}) + "\n")
        out.flush()

    streams = 0
    while time.time() < end:
        try:
            resp = connect(server, ctx, f"{path}?watch=1&resourceVersion={rv}&timeoutSeconds=120")
        except OSError as err:
            note(step="refused", rv=rv, error=f"{type(err).__name__}: {err}")
            time.sleep(0.2)  # a client's back-off before it tries again, not a wait
            continue
        if resp.status != 200:
            note(step="refused", rv=rv, status=resp.status, body=resp.read().decode(errors="replace")[:400])
            if resp.status == 410:
                return True
            time.sleep(0.2)  # a client's back-off before it tries again, not a wait
            continue
        streams += 1
        note(step="watching", rv=rv, stream=streams)
        events, how, gone = 0, "end of stream", False
        try:
            for line in resp:
                event = json.loads(line)
                events += 1
                obj = event["object"]
                if event["type"] == "ERROR":
                    note(step="event", type="ERROR", code=obj.get("code"), reason=obj.get("reason"),
                         message=obj.get("message"), rv=rv)
                    gone = obj.get("code") == 410
                    continue
                rv = obj["metadata"]["resourceVersion"]
                note(step="event", type=event["type"], name=obj["metadata"]["name"], rv=rv)
        except (OSError, http.client.HTTPException, ValueError) as err:
            how = f"{type(err).__name__}: {err}"
        note(step="ended", stream=streams, events=events, how=how, rv=rv)
        if gone:
            return True
    note(step="deadline", rv=rv)
    return False


def relist(out: TextIO, server: str, ctx: ssl.SSLContext, path: str, end: float) -> None:
    while time.time() < end:
        try:
            resp = connect(server, ctx, path)
            body = resp.read()
        except OSError:
            time.sleep(0.2)  # a client's back-off before it tries again, not a wait
            continue
        if resp.status == 200:
            listed = json.loads(body)
            objects = sorted(f'{o["metadata"]["name"]}={o["spec"].get("size")}={o["metadata"]["uid"]}'
                             for o in listed["items"])
            out.write(json.dumps({"step": "relist", "rv": listed["metadata"]["resourceVersion"],
                                  "objects": objects, "t": round(time.time(), 2)}) + "\n")
            return
        time.sleep(0.2)  # a client's back-off before it tries again, not a wait
    out.write(json.dumps({"step": "deadline", "rv": ""}) + "\n")


def main() -> None:
    out_path, kubeconfig, path, rv, deadline = sys.argv[1:]
    end = time.time() + float(deadline)
    conf = yaml.safe_load(Path(kubeconfig).read_text())
    user, cluster = conf["users"][0]["user"], conf["clusters"][0]["cluster"]
    with tempfile.TemporaryDirectory() as tmp, open(out_path, "a", encoding="utf-8") as out:
        crt, key = Path(tmp) / "crt", Path(tmp) / "key"
        crt.write_bytes(base64.b64decode(user["client-certificate-data"]))
        key.write_bytes(base64.b64decode(user["client-key-data"]))
        ctx = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        ctx.load_cert_chain(str(crt), str(key))
        if watch(out, cluster["server"], ctx, path, rv, end):
            relist(out, cluster["server"], ctx, path, end)
        out.write("done\n")


if __name__ == "__main__":
    main()
