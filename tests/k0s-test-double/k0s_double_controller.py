"""`k0s controller` of the k0s test double (not k0s): PKI (bootstrap or join), the join API,
Kubernetes' CRD API server run with k0s's flags and credentials. See the `k0s` script."""

import atexit
import base64
import gzip
import http.server
import json
import os
import pwd
import re
import secrets
import signal
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import ClassVar

from k0s_double_common import (
    ALLOW,
    APISERVER_USER,
    DATA,
    DEFAULT_CONFIG,
    DISABLED_ADMISSION,
    LABEL,
    NOWHERE,
    PKI,
    RUN,
    TOOLS,
    api,
    config_errors,
    die,
    etcdctl,
    external_cluster,
    flags,
    prefix,
    say,
    yaml_dump,
)
from k0s_double_config import (
    STATUS_SOCKET,
    ConfigError,
    cleanup_runtime_config,
    k0s_vars,
    node_config,
    write_runtime_config,
)
from k0s_double_status import k0s_status, serve_status, stop_status
from k0s_double_tokens import token_problem

# --- PKI: bootstrap, join, the API server's certificates ---------------------------------

def openssl(*args: str) -> None:
    res = subprocess.run(["openssl", *args], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        die(f"openssl {args[0]} failed: {res.stderr.strip()[:300]}")


def issue(name: str, subject: str, sans: list[str], eku: str) -> None:
    key, crt, csr = (PKI / f"{name}.key", PKI / f"{name}.crt", PKI / f"{name}.csr")
    ext = ["-addext", f"extendedKeyUsage={eku}"] + (
        ["-addext", "subjectAltName=" + ",".join(sans)] if sans else [])
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", subject, *ext)
    openssl("x509", "-req", "-in", str(csr), "-CA", str(PKI / "ca.crt"), "-CAkey",
            str(PKI / "ca.key"), "-set_serial", str(secrets.randbits(63)), "-days", "365",
            "-copy_extensions", "copy", "-out", str(crt))
    csr.unlink()
    key.chmod(0o600)


def bootstrap_pki() -> None:
    """A CA and a service-account key pair, each only where none exists
    (cmd/controller/controller.go:751-762, pkg/certificate/manager.go:56-62)."""
    if not (PKI / "ca.crt").exists() and not (PKI / "ca.key").exists():
        say("no CA and no join token: bootstrapping a new cluster CA")
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(PKI / "ca.key"),
                "-out", str(PKI / "ca.crt"), "-days", "3650", "-subj", "/CN=kubernetes-ca")
    if not (PKI / "sa.key").exists() and not (PKI / "sa.pub").exists():
        openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                "-out", str(PKI / "sa.key"))
        openssl("pkey", "-in", str(PKI / "sa.key"), "-pubout", "-out", str(PKI / "sa.pub"))


def decode_token(text: str) -> dict:
    import yaml

    return yaml.safe_load(gzip.decompress(base64.b64decode(text.strip())))


# retry-go v3.0.0 (k0s's go.mod) defaults, retry.go:84-91 and options.go:84-129: 10 attempts,
# delay 100 ms, max jitter 100 ms, delay type CombineDelay(BackOffDelay, RandomDelay), no
# max delay. After failed attempt n (0-based, none after the last, retry.go:138-141) it waits
# 100 ms << n plus a random [0, 100 ms): 0.1+0.2+...+25.6 = 51.1 s, up to 52.0 s with jitter.
RETRY_ATTEMPTS = 10
RETRY_DELAY = 0.1
RETRY_MAX_JITTER = 0.1
# Not k0s: a Molecule step that needs a join to have failed, not to have taken k0s's 51 s,
# sets K0S_TEST_DOUBLE_RETRY_SCALE (a drop-in of its own, removed after): every wait below is
# multiplied by it. Unset, the waits are k0s's.
RETRY_SCALE = "K0S_TEST_DOUBLE_RETRY_SCALE"


def retry_delays() -> list[float]:
    """The waits retry.Do makes between the attempts (retry.go:126-162)."""
    try:
        scale = min(1.0, max(0.0, float(os.environ.get(RETRY_SCALE, "1"))))
    except ValueError:
        scale = 1.0
    return [scale * (RETRY_DELAY * (1 << n) + secrets.randbelow(int(RETRY_MAX_JITTER * 1e6)) / 1e6)
            for n in range(RETRY_ATTEMPTS - 1)]


def join(token_file: str, stop: threading.Event) -> None:
    """With --token-file and no CA: the CA and service-account keys from the join API of the
    controller in the token, GET /v1beta1/ca with the token as bearer (pkg/token/
    joinclient.go:71-81); each attempt times out after 10 s and is retried with retry-go's
    defaults (controller.go:793-805), the last error reported: a bad or expired token ends
    the controller non-zero after about 51 s (cmd/controller/controller.go:227-237, 784-811)."""
    try:
        kubeconfig = decode_token(Path(token_file).read_text())
        cluster = kubeconfig["clusters"][0]["cluster"]
        token = kubeconfig["users"][0]["user"]["token"]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as err:
        die(f"failed to join controller: failed to create join client: {err}")
    address = cluster["server"].rstrip("/")
    say(f"Joining existing cluster via {address}")
    ctx = ssl.create_default_context(
        cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    req = urllib.request.Request(address + "/v1beta1/ca", headers={"Authorization": f"Bearer {token}"})
    delays, error = retry_delays(), ""
    for attempt in range(RETRY_ATTEMPTS):
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:
                files = json.loads(resp.read())
            break
        except urllib.error.HTTPError as err:
            error = f"the server has asked for the client to provide credentials ({err.code}: " \
                    f"{err.read().decode()[:200]})" if err.code == 401 else f"HTTP {err.code}"
        except (urllib.error.URLError, OSError, ValueError) as err:
            error = str(err)
        if attempt < RETRY_ATTEMPTS - 1:
            say(f"Failed to join in attempt #{attempt + 1}, retrying after backoff: {error}")
            if stop.wait(delays[attempt]):
                die("failed to join controller: context canceled")
    else:
        die(f"failed to join controller: failed to join existing cluster via {address}: {error}")
    for name, mode in (("ca.crt", 0o644), ("ca.key", 0o640), ("sa.key", 0o640),
                       ("sa.pub", 0o644)):
        (PKI / name).write_bytes(base64.b64decode(files[name]))
        (PKI / name).chmod(mode)
    say(f"Got valid CA response, storing certificates in {PKI}")


def apiserver_certificates(config: dict) -> None:
    """The API server's serving certificate (SANs from spec.api) owned by its user
    (pkg/certificate/manager.go chowns to the component's user), an admin client certificate
    and /var/lib/k0s/pki/admin.conf, 0600 root, server https://localhost:<api.port>, or
    api.address with onlyBindToAddress (pkg/apis/k0s/v1beta1/api.go:70-78,
    cmd/controller/certificates.go:57,99)."""
    spec = api(config)
    names = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "127.0.0.1", spec["address"], *(spec.get("sans") or [])]
    if external := str(spec.get("externalAddress") or ""):
        names.append(external.rsplit(":", 1)[0] if external.count(":") == 1 else external)
    sans = sorted({("IP:" if re.fullmatch(r"[0-9.]+|[0-9a-fA-F:]*:[0-9a-fA-F:.]*", n)
                    else "DNS:") + n for n in names})
    issue("server", "/CN=kube-apiserver", sans, "serverAuth")
    uid = pwd.getpwnam(APISERVER_USER).pw_uid
    for name in ("server.crt", "server.key"):
        os.chown(PKI / name, uid, 0)
    verify = subprocess.run(["openssl", "verify", "-CAfile", str(PKI / "ca.crt"),
                             str(PKI / "admin.crt")], capture_output=True, check=False)
    if verify.returncode != 0:
        issue("admin", "/O=system:masters/CN=master", [], "clientAuth")
    host = spec["address"] if spec.get("onlyBindToAddress") else "localhost"
    b64 = {n: base64.b64encode((PKI / n).read_bytes()).decode()
           for n in ("ca.crt", "admin.crt", "admin.key")}
    conf = {"apiVersion": "v1", "kind": "Config", "current-context": "Default",
            "clusters": [{"name": "local", "cluster": {
                "server": f"https://{host}:{spec.get('port', 6443)}",
                "certificate-authority-data": b64["ca.crt"]}}],
            "users": [{"name": "user", "user": {"client-certificate-data": b64["admin.crt"],
                                                 "client-key-data": b64["admin.key"]}}],
            "contexts": [{"name": "Default", "context": {"cluster": "local", "user": "user"}}]}
    (PKI / "admin.conf").write_text(yaml_dump(conf))
    (PKI / "admin.conf").chmod(0o600)


# --- controller ----------------------------------------------------------------------------

CONTROLLER_VALUES = {"config", "token-file", "data-dir", "status-socket", "disable-components"}
CONTROLLER_BOOLS = {"enable-worker", "no-taints", "debug", "verbose", "single",
                    "enable-dynamic-config"}


def crd_apiserver_flags(binary: str) -> set[str]:
    """The flag names the CRD API server itself knows, read from its own --help."""
    res = subprocess.run([binary, "--help"], capture_output=True, text=True, check=False)
    return set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", res.stdout + res.stderr, re.MULTILINE))


def user_args(config: dict, known: set[str]) -> list[str]:
    """spec.api.extraArgs as --name=value, then rawArgs verbatim (pkg/component/controller/
    apiserver.go:140-145, 218-222). The CRD API server gets each one whose name it knows;
    one it does not know is passed too unless it is an extraArgs key, so that a flag no API
    server knows makes the server exit and crash-loop as kube-apiserver would under k0s's
    supervisor. An extraArgs key the CRD API server lacks is accepted and not passed, said in
    the log: the double has no list of kube-apiserver's own flags to tell a kube-apiserver
    flag from a typo (not modelled)."""
    spec, out = api(config), []
    for name, value in sorted((spec.get("extraArgs") or {}).items()):
        if name in known:
            out.append(f"--{name}={value}")
        else:
            say(f"extraArgs {name}: not passed, the CRD API server stand-in does not know it "
                "(the double cannot tell whether kube-apiserver would)")
    for raw in spec.get("rawArgs") or []:
        name = str(raw).lstrip("-").split("=", 1)[0]
        if name not in known:
            say(f"rawArgs {raw}: passed; the CRD API server does not know it and will exit")
        out.append(str(raw))
    return out


def apiserver_args(config: dict, known: set[str]) -> list[str]:
    """kube-apiserver's flags as k0s derives them: k0s's own, spec.api.extraArgs overriding
    them, rawArgs appended, then the etcd flags (pkg/component/controller/
    apiserver.go:140-145, 218-238): --etcd-servers, --etcd-prefix verbatim, and the three TLS files when set
    (apiserver.go:329-355, prefix 347-349)."""
    spec, ext = api(config), external_cluster(config)
    args = [f"--secure-port={spec.get('port', 6443)}",
            f"--bind-address={spec['address'] if spec.get('onlyBindToAddress') else '0.0.0.0'}",
            f"--tls-cert-file={PKI / 'server.crt'}", f"--tls-private-key-file={PKI / 'server.key'}",
            f"--client-ca-file={PKI / 'ca.crt'}", f"--kubeconfig={RUN / 'nowhere.kubeconfig'}",
            f"--authentication-kubeconfig={RUN / 'nowhere.kubeconfig'}",
            f"--authorization-kubeconfig={RUN / 'nowhere.kubeconfig'}",
            "--authentication-skip-lookup", f"--disable-admission-plugins={DISABLED_ADMISSION}",
            # k0s drains open watches on stop: its stop timeout (request timeout 1m + 2 s,
            # clamped to 20 s) minus 2 s (apiserver.go:179-216)
            "--shutdown-watch-termination-grace-period=18s"]
    override = {name for name in spec.get("extraArgs") or {} if name in known}
    args = [a for a in args if a.split("=", 1)[0].lstrip("-") not in override]
    args += user_args(config, known)
    args.append("--etcd-servers=" + ",".join(ext["endpoints"]))
    args.append(f"--etcd-prefix={ext['etcdPrefix']}")
    if ext.get("caFile") and ext.get("clientCertFile") and ext.get("clientKeyFile"):
        args += [f"--etcd-cafile={ext['caFile']}", f"--etcd-certfile={ext['clientCertFile']}",
                 f"--etcd-keyfile={ext['clientKeyFile']}"]
    return args


def api_ready(config: dict) -> bool:
    ctx = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    ctx.load_cert_chain(str(PKI / "admin.crt"), str(PKI / "admin.key"))
    url = f"https://localhost:{api(config).get('port', 6443)}/readyz?exclude=informer-sync"
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
            return resp.read().decode().strip() == "ok"
    except (urllib.error.URLError, OSError):
        return False


def write_kube_dns_key(config: dict, stop: threading.Event) -> None:
    """k0s's CoreDNS component creates the kube-dns Service through the API (its key
    /<prefix>/services/specs/kube-system/kube-dns is what k0s's inttest/externaletcd checks,
    reference facts). The CRD API server has no Services: the double writes the key itself,
    once its API server is ready, with a value that says so."""
    while not stop.wait(1):
        if api_ready(config):
            value = json.dumps({"kind": "Service", "apiVersion": "v1", "metadata": {
                "name": "kube-dns", "namespace": "kube-system",
                "annotations": {"written-by": LABEL}}})
            res = etcdctl(config, "put", prefix(config) + "services/specs/kube-system/kube-dns",
                          value)
            say("API server ready; kube-dns key written" if res.returncode == 0
                else f"kube-dns key not written: {res.stderr.strip()}")
            return


class JoinAPI(http.server.BaseHTTPRequestHandler):
    """The controller join API on k0sApiPort (9443): a valid controller token gets the CA
    and service-account keys (reference facts: 'the controller join API (9443) hands joining
    controllers the shared k0s CA'). Tokens are checked against the cluster's storage."""

    config: ClassVar[dict] = {}

    def do_GET(self) -> None:
        token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        reason = token_problem(self.config, token) if self.path == "/v1beta1/ca" else "not found"
        if reason:
            body, code = reason.encode(), (404 if reason == "not found" else 401)
        else:
            body, code = json.dumps({n: base64.b64encode((PKI / n).read_bytes()).decode()
                                     for n in ("ca.crt", "ca.key", "sa.key", "sa.pub")}).encode(), 200
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt: str, *args: object) -> None:
        say("join API: " + fmt % args)


def controller(argv: list[str]) -> None:
    if os.environ.get(ALLOW) != "1":
        die(f"refusing to run a controller: {ALLOW}=1 is not set. This is a test double for the "
            "project's Molecule scenarios, not k0s; use a real k0s binary", 2)
    opts = flags(argv, CONTROLLER_VALUES, CONTROLLER_BOOLS, {"c": "config", "d": "debug",
                                                             "v": "verbose"})
    for name in ("single", "enable-dynamic-config", "status-socket", "disable-components",
                 "data-dir", "enable-worker"):
        if opts.get(name):
            die(f"--{name} is not implemented by the test double")
    # k0s.yaml is read once, when the controller starts (cmd/controller/controller.go:463-477):
    # loadNodeConfig, then initDirs, then the runtime config (controller.go:114-131).
    startup_path = opts.get("config", DEFAULT_CONFIG)
    try:
        config = node_config(startup_path)
    except ConfigError as err:
        die(f"failed to load node config: {err}")
    if errors := config_errors(config):
        die("invalid node config: " + "\n".join(errors))
    for d, mode in ((DATA, 0o755), (RUN, 0o755), (DATA / "bin", 0o755), (PKI, 0o751)):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(mode)
    node_vars = k0s_vars(startup_path)
    # removed at exit whatever the cause, as k0s's deferred Cleanup (controller.go:127-131)
    atexit.register(cleanup_runtime_config, write_runtime_config(node_vars, config))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    if opts.get("token-file") and not ((PKI / "ca.crt").exists() and (PKI / "ca.key").exists()):
        join(opts["token-file"], stop)
    bootstrap_pki()
    apiserver_certificates(config)
    (RUN / "nowhere.kubeconfig").write_text(json.dumps(NOWHERE))
    (RUN / "nowhere.kubeconfig").chmod(0o644)
    status = serve_status(str(STATUS_SOCKET), k0s_status(config, node_vars, sys.argv))
    JoinAPI.config = config
    join_api = http.server.ThreadingHTTPServer(("0.0.0.0", int(api(config).get("k0sApiPort", 9443))),
                                               JoinAPI)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(str(PKI / "server.crt"), str(PKI / "server.key"))
    join_api.socket = tls.wrap_socket(join_api.socket, server_side=True)
    threading.Thread(target=join_api.serve_forever, daemon=True).start()
    threading.Thread(target=write_kube_dns_key, args=(config, stop), daemon=True).start()
    binary = TOOLS / "apiextensions-apiserver"
    proc, known = None, crd_apiserver_flags(str(binary))
    while not stop.is_set():
        say(f"starting Kubernetes' CRD API server (the stand-in, not kube-apiserver) as uid "
            f"{APISERVER_USER}, gid 0, no groups: {binary}")
        # uid kube-apiserver, gid 0, no supplementary groups (pkg/component/controller/
        # apiserver.go sets only the UID; pkg/supervisor/detachattr_unix.go:
        # Credential{Uid: uid, Gid: gid} with gid 0).
        proc = subprocess.Popen([str(binary), *apiserver_args(config, known)],
                                user=pwd.getpwnam(APISERVER_USER).pw_uid, group=0, extra_groups=[])
        while proc.poll() is None and not stop.wait(1):
            pass
        if not stop.is_set():  # k0s's supervisor restarts a component that exited
            # pkg/supervisor/supervisor.go:206-207, 278-285: respawned after 5 s
            say(f"the API server exited ({proc.returncode}); respawning in 5s")
            stop.wait(5)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    join_api.shutdown()
    stop_status(status, str(STATUS_SOCKET))
    say("stopped")


