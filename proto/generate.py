"""Regenerate the committed gRPC stubs: `python -m hfl.proto.generate [OUT_DIR]`.

The stubs are generated with one pinned grpcio-tools release, GRPCIO_TOOLS. Its protoc writes
gencode for protobuf 6.31.1, and a _pb2.py module refuses to load on a runtime older than its
gencode or of a lower major version, but loads on any newer runtime: 6.31.1 gencode loads on
protobuf 6.31.1 and later, 7.x included, so this project installs beside tools that need protobuf 6
(Flower 1.41) as well as on protobuf 7. Newer grpcio-tools releases write 7.x gencode, which
protobuf 6 refuses.
"""
from __future__ import annotations

import pathlib
import sys
import tempfile

PROTO_DIR = pathlib.Path(__file__).resolve().parent
PROTO_FILE = "hfl_v1.proto"
GENERATED = ("hfl_v1_pb2.py", "hfl_v1_pb2.pyi", "hfl_v1_pb2_grpc.py")
GRPCIO_TOOLS = "1.78.0"     # keep equal to the test extra's pin in pyproject.toml
GENCODE_PROTOBUF = (6, 31, 1)  # what GRPCIO_TOOLS writes into the stubs' runtime version check


def check_tools_version() -> None:
    from grpc_tools import grpc_version  # only needed to regenerate: a test extra

    if grpc_version.VERSION != GRPCIO_TOOLS:
        raise RuntimeError(f"grpcio-tools {grpc_version.VERSION} is installed; the stubs are generated with grpcio-tools=="
                           f"{GRPCIO_TOOLS} (protobuf {'.'.join(map(str, GENCODE_PROTOBUF))} gencode, loads on protobuf 6 "
                           f"and 7): pip install --no-deps grpcio-tools=={GRPCIO_TOOLS}")


def generate(out_dir: pathlib.Path, proto_dir: pathlib.Path = PROTO_DIR) -> list[pathlib.Path]:
    check_tools_version()
    from grpc_tools import protoc

    import importlib.resources

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-Ihfl/proto={proto_dir}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(proto_dir / PROTO_FILE),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for name in GENERATED:
            target = out_dir / name
            target.write_bytes((pathlib.Path(tmp) / "hfl" / "proto" / name).read_bytes())
            written.append(target)
    return written


if __name__ == "__main__":
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else PROTO_DIR
    for path in generate(out):
        print(path)
