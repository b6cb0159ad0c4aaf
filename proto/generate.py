"""Regenerate the committed gRPC stubs: `python -m hfl.proto.generate [OUT_DIR]`."""
from __future__ import annotations

import pathlib
import sys
import tempfile

PROTO_DIR = pathlib.Path(__file__).resolve().parent
PROTO_FILE = "hfl_v1.proto"
GENERATED = ("hfl_v1_pb2.py", "hfl_v1_pb2.pyi", "hfl_v1_pb2_grpc.py")


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    from grpc_tools import protoc  # only needed to regenerate: a test extra

    import importlib.resources

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-Ihfl/proto={PROTO_DIR}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO_DIR / PROTO_FILE),
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
