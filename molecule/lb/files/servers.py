#!/usr/bin/python3
"""Print HAProxy's view of its backend servers as JSON {backend: {server: status}}, read
from the runtime API socket (show stat)."""
import csv
import io
import json
import socket
import sys

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(sys.argv[1])
sock.sendall(b"show stat\n")
data = b""
while chunk := sock.recv(65536):
    data += chunk
rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
servers = {}
for row in rows:
    if row["svname"] not in ("FRONTEND", "BACKEND"):
        servers.setdefault(row["pxname"], {})[row["svname"]] = row["status"]
print(json.dumps(servers))
