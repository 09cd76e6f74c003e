"""Regenerate the checked-in protobuf modules from the .proto files beside this one:
`make nri-proto` (or `python -m gpuhook.nri.regen`). grpcio-tools (a test dependency) runs
protoc; gpuhook itself needs only the `protobuf` runtime. tests/unit/test_nri_proto.py
regenerates into a temporary directory and holds the checked-in files to the result."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PROTOS = ("nri_api.proto", "nri_ttrpc.proto")  # -> nri_api_pb2.py, nri_ttrpc_pb2.py
# (file names unique in a process: protobuf's default pool holds one "api.proto", and CRI's is one)


def generated_names() -> list[str]:
    return [p.removesuffix(".proto") + "_pb2.py" for p in PROTOS]


def generate(out_dir: str) -> None:
    from grpc_tools import protoc

    rc = protoc.main(
        ["grpc_tools.protoc", f"-I{HERE}", f"--python_out={out_dir}", *(os.path.join(HERE, p) for p in PROTOS)]
    )
    if rc != 0:
        raise RuntimeError(f"protoc exited {rc} on {', '.join(PROTOS)} in {HERE}")


if __name__ == "__main__":
    generate(HERE)
    print("regenerated " + ", ".join(generated_names()), file=sys.stderr)
