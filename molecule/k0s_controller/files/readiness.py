#!/usr/bin/env python3
"""Poll each controller's Kubernetes API /readyz until STOP exists: one JSON line per round,
{"t": seconds, "down": [hosts not ready]}, then "done". The admin credentials come from the
tenant's kubeconfig (client certificate data), the CA from it too.

usage: readiness.py OUT STOP KUBECONFIG HOST=ADDRESS...
"""

import base64
import json
import ssl
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml


def main() -> None:
    out, stop, kubeconfig, *hosts = sys.argv[1:]
    conf = yaml.safe_load(Path(kubeconfig).read_text())
    user, cluster = conf["users"][0]["user"], conf["clusters"][0]["cluster"]
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, key in (("crt", "client-certificate-data"), ("key", "client-key-data")):
            files[name] = Path(tmp) / name
            files[name].write_bytes(base64.b64decode(user[key]))
        ctx = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
        ctx.load_cert_chain(str(files["crt"]), str(files["key"]))
        t0 = time.time()
        with open(out, "w", encoding="utf-8") as fh:
            while not Path(stop).exists():
                down = []
                for host in hosts:
                    name, address = host.split("=", 1)
                    url = f"https://{address}:6443/readyz?exclude=informer-sync"
                    try:
                        with urllib.request.urlopen(url, context=ctx, timeout=1) as resp:
                            ok = resp.read().decode().strip() == "ok"
                    except OSError:
                        ok = False
                    if not ok:
                        down.append(name)
                fh.write(json.dumps({"t": round(time.time() - t0, 2), "down": down}) + "\n")
                fh.flush()
                time.sleep(0.2)
            fh.write("done\n")


if __name__ == "__main__":
    main()
