"""Node labels: values, the NFD feature file, and the Kubernetes API (a fake one on loopback)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import INTEL, NV
from gpuhook.agent import kube, kubeclient, labels
from gpuhook.defaults import AGENT_NAME
from gpuhook.inventory import Inventory
from gpuhook.probe import probe
from fakes.kubeapi import FakeAPI, write_kubeconfig


# -- values and the label set ----------------------------------------------------------------

@pytest.mark.parametrize("text,value", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
    ("AMD Instinct MI300X (CPX)", "AMD-Instinct-MI300X-CPX"),
    ("550.54.14", "550.54.14"),
    ("  -weird__name.  ", "weird__name"),
    ("Ünïcode ✓ GPU", "Unicode-GPU"),
    ("x" * 70, "x" * 63),
    ("a" * 62 + " b", "a" * 62),
    ("", ""), (None, ""), ("---", ""),
])
def test_label_values_are_sanitised(text, value):
    got = labels.label_value(text)
    assert got == value
    assert len(got) <= 63 and (not got or (got[0].isalnum() and got[-1].isalnum()))


def test_labels_of_a_multi_vendor_node():
    got = labels.node_labels(Inventory("/", (NV, INTEL)), runtime_ready=True)
    assert got == {
        "gpuhook.dev/accelerator": "nvidia",
        "gpuhook.dev/accelerator.nvidia": "true",
        "gpuhook.dev/accelerator.intel": "true",
        "gpuhook.dev/gpu.count": "3",
        "gpuhook.dev/gpu.model": "NVIDIA-H100-80GB-HBM3",
        "gpuhook.dev/driver.version": "550.54.14",
        "gpuhook.dev/nvidia.count": "2",
        "gpuhook.dev/nvidia.model": "NVIDIA-H100-80GB-HBM3",
        "gpuhook.dev/nvidia.driver.version": "550.54.14",
        "gpuhook.dev/intel.count": "1",
        "gpuhook.dev/intel.model": "Intel-UHD-770",
        "gpuhook.dev/runtime-ready": "true",
    }


def test_labels_of_a_cpu_only_node():
    assert labels.node_labels(Inventory("/", ())) == {"gpuhook.dev/accelerator": "none", "gpuhook.dev/gpu.count": "0"}


@pytest.mark.parametrize("scenario,primary", [("nvidia", "nvidia"), ("amd", "amd"), ("intel", "intel"),
                                              ("nvidia+intel", "nvidia"), ("bmc", "none"), ("cpu", "none")])
def test_primary_vendor_is_the_first_of_the_env_contract(make_host, scenario, primary):
    got = labels.node_labels(probe(make_host(scenario, mknod=False)))
    assert got["gpuhook.dev/accelerator"] == primary
    assert all(labels.valid_key(k) and labels.label_value(v) == v for k, v in got.items())


# -- the NFD feature file ----------------------------------------------------------------------

def test_nfd_file_is_rewritten_whole_and_only_on_change(tmp_path):
    d = str(tmp_path / "features.d")
    first = labels.node_labels(Inventory("/", (NV, INTEL)), runtime_ready=True)
    assert labels.write_nfd(first, d) is True
    path = os.path.join(d, "gpuhook")
    assert labels.parse_nfd(open(path).read()) == first
    ino = os.stat(path).st_ino
    assert labels.write_nfd(first, d) is False and os.stat(path).st_ino == ino
    # the Intel GPU goes: its labels leave the file (NFD then removes them from the node)
    second = labels.node_labels(Inventory("/", (NV,)), runtime_ready=True)
    assert labels.write_nfd(second, d) is True
    text = open(path).read()
    assert "intel" not in text and labels.parse_nfd(text) == second
    assert os.listdir(d) == ["gpuhook"]  # no temporary file left behind
    assert text.startswith("#") and all("=" in line for line in text.splitlines()[1:])


# -- the API ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tls", [False, True])
def test_api_patch_sets_and_removes_labels(fake_api, tmp_path, tls):
    if tls and not shutil.which("openssl"):
        pytest.skip("no openssl to make a certificate")
    api = fake_api(tls_dir=str(tmp_path) if tls else None, labels={"kubernetes.io/hostname": "node-1", "team": "ml"})
    api.label(AGENT_NAME, {"gpuhook.dev/accelerator.amd": "true", "gpuhook.dev/gpu.count": "1"})  # an earlier round's
    operators = {"gpuhook.dev/install": "true", "gpuhook.dev/pool": "a"}
    api.label("kubectl-label", {**operators, "gpuhook.dev/gpu.model": "hand-made"})
    client = api.client()
    want = labels.node_labels(Inventory("/", (NV, INTEL)), runtime_ready=True)
    synced = labels.sync_node_labels(client, want)
    patch = synced.patch
    assert synced.uid == "uid-1234"
    assert synced.removed == ["gpuhook.dev/accelerator.amd"]
    assert patch["gpuhook.dev/accelerator.amd"] is None and patch["gpuhook.dev/gpu.count"] == "3"
    assert patch["gpuhook.dev/gpu.model"] == want["gpuhook.dev/gpu.model"]  # a key it computes: its value
    have = api.labels
    for k, v in operators.items():  # labels under gpuhook.dev/ that the agent did not set are never removed
        assert have.pop(k) == v
    assert {k: v for k, v in have.items() if k.startswith("gpuhook.dev/")} == want
    assert have["team"] == "ml" and have["kubernetes.io/hostname"] == "node-1"  # not ours: untouched
    method, path, body, ctype = api.requests[-1]
    assert (method, path, ctype) == ("PATCH", "/api/v1/nodes/node-1", "application/merge-patch+json")
    # nothing changed: one GET, no PATCH
    n = len(api.requests)
    assert labels.sync_node_labels(client, want) == labels.NodeSync({}, [], "uid-1234", {})
    assert [r[0] for r in api.requests[n:]] == ["GET"]
    # the node loses its GPUs: every GPU label goes, in one patch
    labels.sync_node_labels(client, labels.node_labels(Inventory("/", ()), runtime_ready=True))
    assert {k: v for k, v in api.labels.items() if k.startswith("gpuhook.dev/")} == {
        "gpuhook.dev/accelerator": "none", "gpuhook.dev/gpu.count": "0", "gpuhook.dev/runtime-ready": "true",
        **operators}


def test_api_errors_are_one_line(fake_api, tmp_path):
    api = fake_api()
    bad = kube.KubeAPI(api.url, "wrong", "node-1")
    with pytest.raises(kubeclient.KubeError, match=r"HTTP 401: Unauthorized") as e:
        bad.get_node()
    assert e.value.status == 401
    with pytest.raises(kubeclient.KubeError, match="HTTP 404"):
        kube.KubeAPI(api.url, api.token, "other-node").get_node()
    closed = kube.KubeAPI("http://127.0.0.1:1", "t", "n", timeout=2)
    with pytest.raises(kubeclient.KubeError, match="GET /api/v1/nodes/n"):
        closed.get_node()
    if shutil.which("openssl"):  # TLS with a CA that did not sign the server's certificate
        tls = fake_api(tls_dir=str(tmp_path))
        (tmp_path / "other").mkdir()
        other = FakeAPI(tls_dir=str(tmp_path / "other"))
        other.close()
        with pytest.raises(kubeclient.KubeError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            kube.KubeAPI(tls.url, tls.token, "node-1", other.ca_file).get_node()


def test_event_on_the_node(fake_api):
    api = fake_api()
    api.client().post_event("GPUInventoryChanged", "2 GPUs: nvidia x2", node_uid="uid-1234", now="2026-01-01T00:00:00Z")
    (ev,) = api.events
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Node", "name": "node-1", "uid": "uid-1234"}
    assert ev["reason"] == "GPUInventoryChanged" and ev["type"] == "Normal" and ev["message"] == "2 GPUs: nvidia x2"
    assert ev["metadata"] == {"generateName": "node-1.gpuhook-", "namespace": "default", "name": "e1"}  # named by the API
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == "2026-01-01T00:00:00Z"
    assert ev["source"] == {"component": "gpuhook-agent", "host": "node-1"}


needs_openssl = pytest.mark.skipif(not shutil.which("openssl"), reason="no openssl to make a certificate")


def test_in_cluster_config(tmp_path):
    sa = tmp_path / "sa"
    assert kube.KubeAPI.in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, str(sa)) is None  # no token
    sa.mkdir()
    (sa / "token").write_text("tok-1\n")
    assert kube.KubeAPI.in_cluster({}, str(sa)) is None  # not in a cluster
    api = kube.KubeAPI.in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443",
                                   "NODE_NAME": "gpu-7"}, str(sa))
    assert (api.base_url, api.node) == ("https://10.0.0.1:6443", "gpu-7")
    v6 = kube.KubeAPI.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "NODE_NAME": "n"}, str(sa))
    assert v6.base_url == "https://[fd00::1]:443"
    assert kube.KubeAPI.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1", "NODE_NAME": "n"}, str(sa),
                                   node="given").node == "given"


def _service_account(tmp_path, api, token: str):
    sa = tmp_path / "sa"
    sa.mkdir(exist_ok=True)
    (sa / "token").write_text(token)
    shutil.copy(api.ca_file, sa / "ca.crt")
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port), "NODE_NAME": "node-1"}
    return sa, env


@needs_openssl
def test_in_cluster_over_tls_with_a_rotating_token(fake_api, tmp_path):
    """The service account's CA checks the API's certificate; the bound token is a file the
    kubelet swaps (a new inode, as the projected volume's ..data link does): the next request
    sends the new token, with no 401 first."""
    api = fake_api(tls_dir=str(tmp_path), token="tok-1")
    sa, env = _service_account(tmp_path, api, "tok-1\n")
    client = kube.KubeAPI.in_cluster(env, str(sa))
    assert client.get_node()["metadata"]["uid"] == "uid-1234"
    assert client.get_node()["metadata"]["name"] == "node-1"
    assert client.token_auth.reads == 1  # not read again while it does not change
    api.token = "tok-2"  # the old token expires on the server...
    new = sa / "token.new"
    new.write_text("tok-2\n")
    os.rename(new, sa / "token")  # ...and the kubelet has swapped the file
    labels.sync_node_labels(client, {"gpuhook.dev/accelerator": "none"})
    assert api.labels["gpuhook.dev/accelerator"] == "none"
    assert api.auth == ["Bearer tok-1", "Bearer tok-1", "Bearer tok-2", "Bearer tok-2"]


@needs_openssl
def test_a_401_reads_the_token_file_again(fake_api, tmp_path):
    """A token file rewritten in place with the same size and mtime (nothing a stat sees):
    the API answers 401 to the old token, the client reads the file again and retries once."""
    api = fake_api(tls_dir=str(tmp_path), token="tok-1")
    sa, env = _service_account(tmp_path, api, "tok-1")
    client = kube.KubeAPI.in_cluster(env, str(sa))
    client.get_node()
    st = os.stat(sa / "token")
    with open(sa / "token", "r+") as f:
        f.write("tok-2")
    os.utime(sa / "token", ns=(st.st_atime_ns, st.st_mtime_ns))
    api.token = "tok-2"
    assert client.get_node()["metadata"]["name"] == "node-1"
    assert api.auth[1:] == ["Bearer tok-1", "Bearer tok-2"]
    # a token the API does not take even after reading it again: one error, HTTP 401
    api.token = "tok-3"
    with pytest.raises(kubeclient.KubeError, match="HTTP 401: Unauthorized") as e:
        client.get_node()
    assert e.value.kind == "http-401" and not e.value.transient
    (sa / "token").unlink()  # the file gone: the last token it had is still sent
    api.token = "tok-2"
    assert client.get_node()["metadata"]["name"] == "node-1"


@needs_openssl
@pytest.mark.parametrize("ca", ["file", "data"])
def test_kubeconfig_with_a_token_and_a_ca(fake_api, tmp_path, ca):
    api = fake_api(tls_dir=str(tmp_path))
    cfg = write_kubeconfig(tmp_path / "kubeconfig", api, ca=ca)
    client = kube.KubeAPI.from_kubeconfig(cfg, node="node-1")
    assert client.base_url == api.url
    synced = labels.sync_node_labels(client, {"gpuhook.dev/accelerator": "nvidia"})
    assert synced.uid == "uid-1234" and api.labels["gpuhook.dev/accelerator"] == "nvidia"
    method, path, body, ctype = api.requests[-1]
    assert (method, path, ctype) == ("PATCH", "/api/v1/nodes/node-1", "application/merge-patch+json")
    assert "fieldManager=gpuhook-agent" in api.queries[-1]
    assert set(api.auth) == {f"Bearer {api.token}"}


@needs_openssl
def test_kubeconfig_token_file_rotates(fake_api, tmp_path):
    api = fake_api(tls_dir=str(tmp_path), token="a-1")
    (tmp_path / "tok").write_text("a-1")
    cfg = write_kubeconfig(tmp_path / "kubeconfig", api, user={"tokenFile": "tok"})  # relative to the file
    client = kube.KubeAPI.from_kubeconfig(cfg, node="node-1")
    client.get_node()
    (tmp_path / "tok.new").write_text("a-2")
    os.rename(tmp_path / "tok.new", tmp_path / "tok")
    api.token = "a-2"
    client.get_node()
    assert api.auth == ["Bearer a-1", "Bearer a-2"]


@needs_openssl
def test_kubeconfig_errors_are_one_line(fake_api, tmp_path):
    api = fake_api(tls_dir=str(tmp_path))
    cases = {"missing": str(tmp_path / "nope")}
    (tmp_path / "garbage").write_text("just: [a list\n")
    cases["garbage"] = str(tmp_path / "garbage")
    (tmp_path / "empty").write_text("apiVersion: v1\nkind: Config\n")
    cases["empty"] = str(tmp_path / "empty")
    for name, path in cases.items():
        with pytest.raises(kubeclient.KubeError) as e:
            kube.KubeAPI.from_kubeconfig(path, node="n")
        assert e.value.kind == "config" and str(e.value).startswith(f"--kubeconfig {path}: ")
        assert "\n" not in str(e.value), (name, str(e.value))
    cfg = write_kubeconfig(tmp_path / "kubeconfig", api)
    with pytest.raises(kubeclient.KubeError, match="Context 'nope' not found"):
        kube.KubeAPI.from_kubeconfig(cfg, "nope", node="n")
    # no CA in the kubeconfig: the system's CAs do not know the fake API's certificate
    bare = kube.KubeAPI.from_kubeconfig(write_kubeconfig(tmp_path / "bare", api, ca="none"), node="node-1")
    with pytest.raises(kubeclient.KubeError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed") as e:
        bare.get_node()
    assert e.value.kind == "tls" and e.value.status is None


@needs_openssl
def test_kubeconfig_with_a_client_certificate_and_an_exec_plugin(fake_api, tmp_path):
    """The other ways kubectl users authenticate: a client certificate (the API requires
    one), and an exec plugin that prints an ExecCredential with the token."""
    cert, key = str(tmp_path / "client.crt"), str(tmp_path / "client.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=gpuhook-agent",
                    "-keyout", key, "-out", cert], check=True, capture_output=True)
    (tmp_path / "srv").mkdir()
    api = fake_api(tls_dir=str(tmp_path / "srv"), client_ca=cert)
    plugin = tmp_path / "creds.sh"
    plugin.write_text("#!/bin/sh\necho '{\"apiVersion\": \"client.authentication.k8s.io/v1beta1\", "
                      "\"kind\": \"ExecCredential\", \"status\": {\"token\": \"'$TOKEN'\"}}'\n")
    plugin.chmod(0o755)
    user = {"client-certificate": "client.crt", "client-key": "client.key",
            "exec": {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": str(plugin),
                     "env": [{"name": "TOKEN", "value": api.token}]}}
    cfg = write_kubeconfig(tmp_path / "kubeconfig", api, user=user)
    assert kube.KubeAPI.from_kubeconfig(cfg, node="node-1").get_node()["metadata"]["uid"] == "uid-1234"
    assert api.auth == [f"Bearer {api.token}"]
    # without the certificate the TLS handshake fails: one error, no answer
    user.pop("client-certificate"), user.pop("client-key")
    no_cert = kube.KubeAPI.from_kubeconfig(write_kubeconfig(tmp_path / "kubeconfig", api, user=user), node="node-1")
    with pytest.raises(kubeclient.KubeError) as e:
        no_cert.get_node()
    assert e.value.status is None and len(api.auth) == 1
