"""The host bundle carries the Kubernetes client: lightkube and every distribution it needs,
extras included (httpx2[http2,ws] -> h2, wsproto), within the size budget; the bundled
Python reaches a (fake) API over TLS with the in-cluster config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from gpuhook.install import build
from fakes.kubeapi import FakeAPI

MAX_BUNDLE_BYTES = 100 * 1000 * 1000  # the bundle (and what it adds to the image), uncompressed; grpcio (gpuhook dra) is 19 MB of it


def test_requirements_follow_extras(monkeypatch):
    for hide in ((), ("packaging.requirements",), ("packaging.requirements", "pip._vendor.packaging.requirements")):
        for name in hide:  # without `packaging`: pip's copy, then the fallback parser
            monkeypatch.setitem(sys.modules, name, None)
        if len(hide) < 2:  # markers are evaluated
            assert build._wanted("httpx2-jsfetch; sys_platform == 'emscripten' and python_version >= '3.12'") is None
        assert build._wanted("httpx2[http2,ws]>=0.28.1") == ("httpx2", ("http2", "ws"))
        assert build._wanted("h2<5,>=3; extra == 'http2'", ("http2", "ws")) == ("h2", ())
        assert build._wanted("h2<5,>=3; extra == 'http2'") is None
        assert build._wanted("click>=8; extra == 'cli'", ("http2",)) is None
        assert build._wanted("lightkube>=1.0") == ("lightkube", ())
        # whatever the parser, the distributions gpuhook needs are found and nothing else fails
        names = {d.metadata["Name"].lower() for d in build._distributions(["lightkube>=1.0"])}
        assert {"lightkube", "httpx2", "h2", "wsproto", "msgspec"} <= names and "httpx2-jsfetch" not in names


@pytest.mark.skipif(not shutil.which("openssl") or not shutil.which("ldd"), reason="needs openssl and ldd")
def test_the_bundle_has_the_client_and_it_works(tmp_path):
    out = tmp_path / "bundle"
    record = build.build(str(out))
    names = {p.split("==")[0].lower().replace("_", "-") for p in record["packages"]}
    assert {"lightkube", "lightkube-models", "httpx2", "httpcore2", "h11", "h2", "wsproto", "msgspec", "pyyaml",
            "anyio", "idna"} <= names, names
    size = sum(os.lstat(out / f).st_size for f in record["files"] if os.path.isfile(out / f))
    assert size <= MAX_BUNDLE_BYTES, f"bundle is {size / 1e6:.1f} MB"

    (tmp_path / "tls").mkdir()
    api = FakeAPI(tls_dir=str(tmp_path / "tls"), token="sa-token")
    try:
        sa = tmp_path / "sa"
        sa.mkdir()
        (sa / "token").write_text("sa-token\n")
        shutil.copy(api.ca_file, sa / "ca.crt")
        site = out / "lib" / build.PY / "site-packages"
        code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
                "import json, gpuhook.agent.kube as k, lightkube\n"
                "api = k.KubeAPI.in_cluster(sa_dir=sys.argv[2])\n"
                "print(json.dumps([lightkube.__file__, api.get_node()['metadata']['uid']]))")
        env = {"PATH": "/usr/bin:/bin", "KUBERNETES_SERVICE_HOST": "127.0.0.1",
               "KUBERNETES_SERVICE_PORT": str(api.port), "NODE_NAME": "node-1"}
        r = subprocess.run([str(out / "bin" / "python3"), "-I", "-S", "-c", code, str(site), str(sa)],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        where, uid = json.loads(r.stdout)
        assert where.startswith(str(site)) and uid == "uid-1234"
    finally:
        api.close()
