#!/usr/bin/python3
"""Connect COUNT times to ADDRESS:PORT for each port (TLS, certificate not checked: the
stand-ins' certificates are throwaway) and print {port: [answer or ERROR ...]} as JSON.
Each request is a new TCP connection, so the load balancer picks a server each time."""
import http.client
import json
import ssl
import sys

address, ports, count = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
answers = {}
for port in ports:
    answers[port] = []
    for _ in range(count):
        conn = http.client.HTTPSConnection(address, int(port), timeout=5, context=ctx)
        try:
            conn.request("GET", "/", headers={"Connection": "close"})
            answers[port].append(conn.getresponse().read().decode())
        except (OSError, http.client.HTTPException) as exc:
            answers[port].append(f"ERROR {exc!r}")
        finally:
            conn.close()
print(json.dumps(answers))
