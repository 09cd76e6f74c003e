"""Regenerate the checked-in gRPC modules from the kubelet's .proto files beside this one:
`make dra-proto` (or `python -m gpuhook.dra.regen`). grpcio-tools (a test dependency) runs
protoc; gpuhook itself needs only the `grpcio` and `protobuf` runtimes.
tests/unit/test_dra_proto.py regenerates into a temporary directory and holds the checked-in
files to the result.

The .proto files are the kubelet's own, byte for byte (Apache-2.0, k8s.io/kubelet v0.37.2):
dra.proto is pkg/apis/dra/v1/api.proto, pluginregistration.proto is
pkg/apis/pluginregistration/v1/api.proto, podresources.proto is
pkg/apis/podresources/v1/api.proto (the agent's client of the kubelet's pod-resources API,
agent/podres.py). They are renamed because protobuf's default pool holds one file per name (CRI's is an api.proto too) and compiled from the repository's root,
so that the generated modules import each other as gpuhook.dra.*.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))  # the directory that holds gpuhook/
PACKAGE_DIR = os.path.relpath(HERE, TOP)  # gpuhook/dra
PROTOS = ("dra.proto", "pluginregistration.proto", "podresources.proto")


def generated_names() -> list[str]:
    """The files protoc writes for PROTOS: messages (_pb2) and services (_pb2_grpc)."""
    return [p.removesuffix(".proto") + suffix for p in PROTOS for suffix in ("_pb2.py", "_pb2_grpc.py")]


def generate(out_dir: str) -> str:
    """protoc over PROTOS into out_dir; returns the directory the modules are in
    (out_dir/gpuhook/dra)."""
    from grpc_tools import protoc

    sources = [os.path.join(PACKAGE_DIR, p) for p in PROTOS]
    args = ["grpc_tools.protoc", f"-I{TOP}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *sources]
    cwd = os.getcwd()
    os.chdir(TOP)  # protoc names the files by their path under -I
    try:
        rc = protoc.main(args)
    finally:
        os.chdir(cwd)
    if rc != 0:
        raise RuntimeError(f"protoc exited {rc} on {', '.join(PROTOS)} in {HERE}")
    return os.path.join(out_dir, PACKAGE_DIR)


if __name__ == "__main__":
    made = generate(TOP)
    print("regenerated " + ", ".join(os.path.join(made, n) for n in generated_names()), file=sys.stderr)
