"""A real Kubernetes control plane on this machine, for the cluster tests: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler of versions.KUBERNETES_VERSION, built from the Go
module proxy (gobuild.py) and started as a kubeadm cluster runs them: certificates made at
start (one CA, a serving certificate, a client certificate per component), RBAC and the Node
authorizer, the default admission plugins plus NodeRestriction (ValidatingAdmissionPolicy among
them), ServiceAccount tokens signed by the apiserver. Only the timers the outage tests wait on
are shortened (Timers).

Network: the apiserver listens on ADDRESS:PORT, an address on the host side of a bridge
(BRIDGE, SUBNET) the control plane makes: the nodes (tests/cluster/node.py, each in network
namespaces of its own) join the bridge with a veth and reach the apiserver there; the tests on
the host reach it at the same address (a local one). Nothing listens on another interface:
etcd, the controller manager's and the scheduler's own ports are on 127.0.0.1.

What a killed run leaves: the daemons die with the test process (PR_SET_PDEATHSIG), and what
outlives it anyway (a SIGKILL'd pytest whose children were mid-start, the bridge, STATE with
etcd's data and the certificates) the next start removes first: each daemon's pid and start
time are written under STATE/pids, and only a process that is still that one is killed. No
mounts, no unix sockets. One control plane per machine at a time (a lock in the suite's
cache dir, shared with `make test-other-release`'s root, which sees the same network)."""

from __future__ import annotations

import base64
import contextlib
import ctypes
import dataclasses
import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse

import gobuild
from versions import KUBERNETES_VERSION

BRIDGE = "ghk8s0"  # the host side of the nodes' network; node.py attaches each node's veth here
SUBNET = "10.251.0.0/24"  # the nodes' addresses (node.py)
ADDRESS = "10.251.0.1"  # the apiserver's, on BRIDGE (and the `kubernetes` Service's endpoint)
PREFIX = 24
PORT = 6443
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service
CLUSTER_CIDR = "10.252.0.0/16"  # pod addresses: node.py gives each node a /24 of it (CNI host-local)
STATE = os.environ.get("GPUHOOK_CLUSTER_STATE", "/run/gpuhook-test-cluster")
LOCK = os.path.join(gobuild.CACHE, ".cluster.lock")
ISSUER = "https://kubernetes.default.svc.cluster.local"
DAEMONS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")  # in start order


@dataclasses.dataclass(frozen=True)
class Timers:
    """The cluster's timers the outage tests wait on, in seconds (a real cluster's: 40 or 50,
    5, 300, 300). A kubelet must renew its lease well inside node_monitor_grace_period (node.py:
    nodeLeaseDurationSeconds and nodeStatusUpdateFrequency short too)."""

    node_monitor_grace_period: int = 8  # kube-controller-manager: no heartbeat for this long -> NotReady/Unknown
    node_monitor_period: int = 1  # how often the node lifecycle controller looks
    not_ready_toleration: int = 2  # kube-apiserver: the default toleration of node.kubernetes.io/not-ready
    unreachable_toleration: int = 2  # ... and of node.kubernetes.io/unreachable (then pods are evicted)


class ControlPlaneError(RuntimeError):
    """The control plane did not come up; str() is one line (the daemon's logs are in the
    message's file)."""


def _pdeathsig() -> None:  # in the child, before exec: die with the test process
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_time(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]  # field 22, starttime
    except (OSError, IndexError):
        return None


def _run(argv: list[str], **kw) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)
    if r.returncode != 0:
        raise ControlPlaneError(f"{' '.join(argv[:3])}: exit {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r.stdout


# -- certificates (openssl) ---------------------------------------------------------------------

class PKI:
    """One CA and the certificates signed by it, as files under `directory` (EC P-256: quick to
    make; the ServiceAccount signing key is RSA, as kube-apiserver wants)."""

    def __init__(self, directory: str):
        self.dir = directory
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.ca_cert = self.path("ca.crt")
        self.ca_key = self.path("ca.key")
        _run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
              "-keyout", self.ca_key, "-out", self.ca_cert, "-days", "7", "-subj", "/CN=gpuhook-test-cluster-ca",
              "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"])
        self.sa_key = self.path("sa.key")
        self.sa_pub = self.path("sa.pub")
        _run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", self.sa_key])
        _run(["openssl", "pkey", "-in", self.sa_key, "-pubout", "-out", self.sa_pub])

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    def issue(self, name: str, cn: str, orgs: tuple[str, ...] = (), *, server: bool = False,
              sans: tuple[str, ...] = ()) -> tuple[str, str]:
        """A certificate NAME.crt (and NAME.key) for CN/O=orgs: a client's, or a server's with
        `sans` ("DNS:x", "IP:y"). Returns (cert, key)."""
        cert, key, csr, ext = (self.path(f"{name}.{x}") for x in ("crt", "key", "csr", "ext"))
        subj = "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"
        _run(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
              "-keyout", key, "-out", csr, "-subj", subj])
        lines = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
                 "extendedKeyUsage=" + ("serverAuth" if server else "clientAuth")]
        if sans:
            lines.append("subjectAltName=" + ",".join(sans))
        with open(ext, "w") as f:
            f.write("\n".join(lines) + "\n")
        _run(["openssl", "x509", "-req", "-in", csr, "-CA", self.ca_cert, "-CAkey", self.ca_key, "-CAcreateserial",
              "-days", "7", "-out", cert, "-extfile", ext])
        os.unlink(csr)
        return cert, key


def _b64(path: str) -> str:
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


def write_kubeconfig(path: str, server: str, ca_cert: str, cert: str, key: str, user: str) -> str:
    """A kubeconfig with everything in it (the files' contents as *-data): one file a node can
    take into its own root. JSON is YAML."""
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "gpuhook-test",
           "clusters": [{"name": "gpuhook-test", "cluster": {"server": server,
                                                             "certificate-authority-data": _b64(ca_cert)}}],
           "users": [{"name": user, "user": {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}}],
           "contexts": [{"name": "gpuhook-test", "context": {"cluster": "gpuhook-test", "user": user}}]}
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    os.chmod(path, 0o600)
    return path


# -- the API, spoken plainly --------------------------------------------------------------------

@dataclasses.dataclass
class Response:
    status: int
    body: dict

    @property
    def message(self) -> str:
        """The Status message of a refusal ("" for an object)."""
        return str(self.body.get("message", "")) if self.body.get("kind") == "Status" else ""


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler, started by start() and
    gone after stop() (which a failed start() calls itself).

    After start():
      server       https://ADDRESS:PORT
      address      ADDRESS (on BRIDGE); port PORT
      ca_cert      the cluster CA's certificate (path); ca_key its key (to sign more)
      kubeconfig   cluster-admin's kubeconfig (system:masters), self-contained
      service_cidr, cluster_cidr, bridge, subnet
      timers       the Timers the cluster runs with
    Methods: node_kubeconfig(name), proxy_kubeconfig(), binary(name), kubectl(...), api(...),
    agent_token(...). Usable as a context manager."""

    def __init__(self, state: str = STATE, timers: Timers = Timers(), log=None):
        self.state = state
        self.timers = timers
        self.address, self.port, self.bridge, self.subnet = ADDRESS, PORT, BRIDGE, SUBNET
        self.server = f"https://{ADDRESS}:{PORT}"
        self.service_cidr, self.cluster_cidr = SERVICE_CIDR, CLUSTER_CIDR
        self.version = KUBERNETES_VERSION
        self.log = log or (lambda msg: print(f"controlplane: {msg}", file=sys.stderr, flush=True))
        self.pki: PKI | None = None
        self.procs: dict[str, subprocess.Popen] = {}
        self._lock_fd: int | None = None
        self._ctx_admin: ssl.SSLContext | None = None

    # -- paths --

    @property
    def ca_cert(self) -> str:
        return os.path.join(self.state, "pki", "ca.crt")

    @property
    def ca_key(self) -> str:
        return os.path.join(self.state, "pki", "ca.key")

    @property
    def kubeconfig(self) -> str:
        """cluster-admin's (system:masters)."""
        return os.path.join(self.state, "admin.kubeconfig")

    admin_kubeconfig = kubeconfig

    @property
    def logs(self) -> str:
        """The daemons' logs: beside STATE, kept when start() fails (removed by the next start)."""
        return logs_of(self.state)

    def logfile(self, daemon: str) -> str:
        return os.path.join(self.logs, f"{daemon}.log")

    def binary(self, name: str) -> str:
        """A built binary of the cluster's version: kubelet, kube-proxy, kubectl, etcd, ...
        (built when missing: raises gobuild.Unavailable with one line)."""
        return gobuild.binary("etcd" if name == "etcd" else "kubernetes", name)

    # -- life --

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 180) -> None:
        """Build (or find) the binaries, clean up what a killed run left, make the bridge and
        the certificates, start the four daemons and wait until the apiserver is ready, the
        controller manager has made the `default` ServiceAccount and the scheduler answers.
        Raises gobuild.Unavailable (no Go, no proxy) or ControlPlaneError, one line each."""
        bins = {name: self.binary(name) for name in ("etcd", "kube-apiserver", "kube-controller-manager",
                                                      "kube-scheduler", "kubectl")}
        os.makedirs(os.path.dirname(LOCK), exist_ok=True)
        self._lock_fd = fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            self.log(f"another run's control plane is up (pid {holder}): waiting for it to end")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            cleanup(self.state)
            for d in ("pki", "pids", "etcd"):
                os.makedirs(os.path.join(self.state, d), mode=0o700, exist_ok=True)
            os.makedirs(self.logs, mode=0o700)
            self._bridge()
            self._certificates()
            self._start_daemons(bins)
            self._wait_ready(timeout)
        except BaseException:
            self.stop(keep_logs=True)
            raise

    def _bridge(self) -> None:
        """BRIDGE with ADDRESS, made unless it is there (a marker under STATE says this control
        plane made it: stop() and the next run's cleanup remove only a bridge so marked)."""
        if not os.path.exists(f"/sys/class/net/{BRIDGE}"):
            _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
            with open(os.path.join(self.state, "bridge"), "w") as f:
                f.write(BRIDGE + "\n")
        if f"inet {ADDRESS}/" not in _run(["ip", "-4", "addr", "show", "dev", BRIDGE]):
            _run(["ip", "addr", "add", f"{ADDRESS}/{PREFIX}", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])

    def _certificates(self) -> None:
        self.pki = pki = PKI(os.path.join(self.state, "pki"))
        sans = ("DNS:kubernetes", "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local", "DNS:localhost", f"IP:{ADDRESS}", f"IP:{SERVICE_IP}",
                "IP:127.0.0.1")
        pki.issue("apiserver", "kube-apiserver", server=True, sans=sans)
        pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",))
        for name, cn, orgs in (("admin", "kubernetes-admin", ("system:masters",)),
                               ("kube-controller-manager", "system:kube-controller-manager", ()),
                               ("kube-scheduler", "system:kube-scheduler", ())):
            cert, key = pki.issue(name, cn, orgs)
            path = self.kubeconfig if name == "admin" else os.path.join(self.state, f"{name}.kubeconfig")
            write_kubeconfig(path, self.server, pki.ca_cert, cert, key, cn)
        ctx = ssl.create_default_context(cafile=pki.ca_cert)
        ctx.load_cert_chain(pki.path("admin.crt"), pki.path("admin.key"))
        self._ctx_admin = ctx

    def _argv(self, bins: dict[str, str]) -> dict[str, list[str]]:
        p, t, s = self.pki, self.timers, self.state
        assert p is not None
        client, peer = _free_port(), _free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        cm_kc, sched_kc = (os.path.join(s, f"{n}.kubeconfig") for n in ("kube-controller-manager", "kube-scheduler"))
        self.scheduler_port, self.cm_port = _free_port(), _free_port()
        return {
            "etcd": [bins["etcd"], "--name", "gpuhook-test", "--data-dir", os.path.join(s, "etcd"),
                     "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
                     "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                     "--initial-cluster", f"gpuhook-test=http://127.0.0.1:{peer}",
                     "--unsafe-no-fsync", "--log-level", "warn"],
            "kube-apiserver": [
                bins["kube-apiserver"], f"--advertise-address={ADDRESS}", f"--bind-address={ADDRESS}",
                f"--secure-port={PORT}", "--allow-privileged=true", "--authorization-mode=Node,RBAC",
                f"--client-ca-file={p.ca_cert}", "--enable-admission-plugins=NodeRestriction",
                f"--etcd-servers={self.etcd_url}",
                f"--kubelet-client-certificate={p.path('apiserver-kubelet-client.crt')}",
                f"--kubelet-client-key={p.path('apiserver-kubelet-client.key')}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                f"--service-account-issuer={ISSUER}", f"--service-account-key-file={p.sa_pub}",
                f"--service-account-signing-key-file={p.sa_key}", f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--tls-cert-file={p.path('apiserver.crt')}", f"--tls-private-key-file={p.path('apiserver.key')}",
                f"--cert-dir={os.path.join(s, 'pki')}", "--profiling=false",
                f"--default-not-ready-toleration-seconds={t.not_ready_toleration}",
                f"--default-unreachable-toleration-seconds={t.unreachable_toleration}"],
            "kube-controller-manager": [
                bins["kube-controller-manager"], f"--kubeconfig={cm_kc}", f"--authentication-kubeconfig={cm_kc}",
                f"--authorization-kubeconfig={cm_kc}", "--bind-address=127.0.0.1", f"--secure-port={self.cm_port}",
                f"--cert-dir={os.path.join(s, 'pki', 'cm')}", f"--client-ca-file={p.ca_cert}",
                f"--cluster-signing-cert-file={p.ca_cert}", f"--cluster-signing-key-file={p.ca_key}",
                f"--root-ca-file={p.ca_cert}", f"--service-account-private-key-file={p.sa_key}",
                "--use-service-account-credentials=true", "--controllers=*,bootstrapsigner,tokencleaner",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--node-monitor-grace-period={t.node_monitor_grace_period}s",
                f"--node-monitor-period={t.node_monitor_period}s", "--leader-elect=false", "--profiling=false"],
            "kube-scheduler": [
                bins["kube-scheduler"], f"--kubeconfig={sched_kc}", f"--authentication-kubeconfig={sched_kc}",
                f"--authorization-kubeconfig={sched_kc}", "--bind-address=127.0.0.1",
                f"--secure-port={self.scheduler_port}", f"--cert-dir={os.path.join(s, 'pki', 'sched')}",
                "--leader-elect=false", "--profiling=false"],
        }

    def _start_daemons(self, bins: dict[str, str]) -> None:
        argvs = self._argv(bins)
        for name in DAEMONS:
            with open(self.logfile(name), "ab") as out:
                proc = subprocess.Popen(argvs[name], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                        start_new_session=True, preexec_fn=_pdeathsig, cwd=self.state)
            self.procs[name] = proc
            with open(os.path.join(self.state, "pids", name), "w") as f:
                f.write(f"{proc.pid} {_start_time(proc.pid)}\n")
            if name == "etcd":
                self._wait(lambda: self._etcd_healthy(), 60, "etcd")
            elif name == "kube-apiserver":  # its RBAC roles bootstrapped, or the others fail to start
                self._wait(lambda: self._get_ok("/readyz"), 120, "kube-apiserver /readyz")

    def _etcd_healthy(self) -> bool:
        host, port = self.etcd_url.removeprefix("http://").split(":")
        try:
            c = http.client.HTTPConnection(host, int(port), timeout=2)
            c.request("GET", "/health")
            return json.loads(c.getresponse().read()).get("health") == "true"
        except (OSError, ValueError):
            return False

    def _healthz(self, port: int) -> bool:
        ctx = ssl._create_unverified_context()  # the daemon's own self-signed serving cert
        try:
            c = http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=ctx)
            c.request("GET", "/healthz")
            return c.getresponse().status == 200
        except OSError:
            return False

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(f"{name} exited {proc.returncode} while waiting for {what}: "
                                            f"{self._tail(name)} (log: {self.logfile(name)})")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{what} not ready after {timeout:.0f} s (logs: {self.logs})")
            time.sleep(0.5)

    def _tail(self, name: str) -> str:
        try:
            with open(self.logfile(name), errors="replace") as f:
                lines = [line.strip() for line in f.read().splitlines() if line.strip()]
        except OSError:
            return "no log"
        return lines[-1] if lines else "no output"

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        left = lambda: max(deadline - time.monotonic(), 1)  # noqa: E731
        self._wait(lambda: self._get_ok("/api/v1/namespaces/default/serviceaccounts/default"), left(),
                   "the controller manager (the default ServiceAccount)")
        self._wait(lambda: self._healthz(self.scheduler_port), left(), "kube-scheduler /healthz")
        self.log(f"Kubernetes {self.version} control plane ready at {self.server} (state: {self.state})")

    def _get_ok(self, path: str) -> bool:
        try:
            return self.api("GET", path).status == 200
        except OSError:
            return False

    def stop(self, keep_logs: bool = False) -> None:
        """Stop the daemons (the scheduler first, etcd last), remove the bridge, STATE and the
        logs (unless keep_logs). Safe to call twice, and on a half-started control plane."""
        for name in reversed(DAEMONS):
            proc = self.procs.pop(name, None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        cleanup(self.state, keep_logs=keep_logs)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- credentials for the nodes --

    def node_kubeconfig(self, name: str, path: str | None = None) -> str:
        """A kubeconfig for the kubelet of node NAME (system:node:NAME in system:nodes: what the
        Node authorizer and NodeRestriction know it by), written to path (default under
        STATE). Self-contained: copy it into the node's root."""
        assert self.pki is not None, "start() first"
        cert, key = self.pki.issue(f"node-{name}", f"system:node:{name}", ("system:nodes",))
        return write_kubeconfig(path or os.path.join(self.state, f"node-{name}.kubeconfig"), self.server,
                                self.pki.ca_cert, cert, key, f"system:node:{name}")

    def proxy_kubeconfig(self, path: str | None = None) -> str:
        """A kubeconfig for kube-proxy (system:kube-proxy, bound to system:node-proxier)."""
        assert self.pki is not None, "start() first"
        cert, key = self.pki.issue("kube-proxy", "system:kube-proxy")
        return write_kubeconfig(path or os.path.join(self.state, "kube-proxy.kubeconfig"), self.server,
                                self.pki.ca_cert, cert, key, "system:kube-proxy")

    # -- talking to it --

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess:
        """The cluster's own kubectl as cluster-admin (or with the --as... of args); check:
        assert it exits 0, its output in the message when not."""
        r = subprocess.run([self.binary("kubectl"), f"--kubeconfig={self.kubeconfig}", *args], input=input,
                           capture_output=True, text=True, timeout=timeout,
                           stdin=None if input is not None else subprocess.DEVNULL)
        assert not check or r.returncode == 0, f"kubectl {' '.join(args)}: exit {r.returncode}\n{r.stderr}"
        return r

    def api(self, method: str, path: str, body: dict | list | None = None, *, token: str | None = None,
            user: str | None = None, groups: tuple[str, ...] = (), extra: dict[str, list[str]] | None = None,
            content_type: str = "application/json", timeout: float = 30) -> Response:
        """One request to the apiserver: as cluster-admin, or as `user` (with `groups` and
        `extra`) by impersonation, or with a bearer `token` (no client certificate: the token
        is who it is). A JSON body; content_type for patches (application/merge-patch+json,
        application/json-patch+json, application/strategic-merge-patch+json)."""
        assert self._ctx_admin is not None, "start() first"
        headers = {"Accept": "application/json"}
        if token is not None:
            ctx = ssl.create_default_context(cafile=self.ca_cert)
            headers["Authorization"] = f"Bearer {token}"
        else:
            ctx = self._ctx_admin
        if user is not None:
            headers["Impersonate-User"] = user
        data = None if body is None else json.dumps(body).encode()
        if data is not None:
            headers["Content-Type"] = content_type
        conn = http.client.HTTPSConnection(self.address, self.port, timeout=timeout, context=ctx)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for k, v in headers.items():
                conn.putheader(k, v)
            if user is not None:  # a header per group, per value of an extra
                for g in groups:
                    conn.putheader("Impersonate-Group", g)
                for k, values in (extra or {}).items():
                    for v in values:
                        conn.putheader(f"Impersonate-Extra-{urllib.parse.quote(k, safe='')}", v)
            if data is not None:
                conn.putheader("Content-Length", str(len(data)))
            conn.endheaders(data)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"kind": "Status", "message": raw.decode(errors="replace")}
        return Response(resp.status, parsed if isinstance(parsed, dict) else {"items": parsed})

    def agent_token(self, namespace: str, serviceaccount: str, pod: str, audience: str | None = None,
                    seconds: int = 3600) -> str:
        """A token of the ServiceAccount bound to a Pod (TokenRequest, as the kubelet gets one
        for a pod's projected volume): the apiserver puts the pod's node name into it, which
        the user it authenticates carries as the extra authentication.kubernetes.io/node-name."""
        spec: dict = {"expirationSeconds": seconds,
                      "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod,
                                         "uid": self.api("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")
                                         .body["metadata"]["uid"]}}
        if audience:
            spec["audiences"] = [audience]
        r = self.api("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{serviceaccount}/token",
                     {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
        assert r.status == 201, r
        return r.body["status"]["token"]


# -- what a killed run left ---------------------------------------------------------------------

def leftovers(state: str = STATE) -> list[str]:
    """What of a control plane is still there, in words ([]: nothing)."""
    found = []
    for pid, name in _recorded(state):
        found.append(f"{name} (pid {pid})")
    if os.path.exists(os.path.join(state, "bridge")) and os.path.exists(f"/sys/class/net/{BRIDGE}"):
        found.append(f"bridge {BRIDGE}")
    for path in (state, logs_of(state)):
        if os.path.lexists(path):
            found.append(path)
    return found


def _recorded(state: str) -> list[tuple[int, str]]:
    """(pid, daemon) of the recorded daemons that are still those processes."""
    out = []
    d = os.path.join(state, "pids")
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else ():
        try:
            with open(os.path.join(d, name)) as f:
                pid_s, start = f.read().split()
        except (OSError, ValueError):
            continue
        if _start_time(int(pid_s)) == start:
            out.append((int(pid_s), name))
    return out


def logs_of(state: str) -> str:
    return state + "-logs"


def cleanup(state: str = STATE, keep_logs: bool = False) -> None:
    """Remove what a control plane left: its daemons (only the processes its pid files name,
    still the same ones), the bridge if it made it, STATE."""
    for pid, _name in _recorded(state):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if _start_time(pid) is None:
                break
            time.sleep(0.05)
    if os.path.exists(os.path.join(state, "bridge")) and os.path.exists(f"/sys/class/net/{BRIDGE}"):
        subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, stdin=subprocess.DEVNULL)
    shutil.rmtree(state, ignore_errors=True)
    if not keep_logs:
        shutil.rmtree(logs_of(state), ignore_errors=True)

