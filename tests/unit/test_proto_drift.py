"""The committed stubs must be what protoc makes of proto/hfl_v1.proto today."""
import pathlib

from hfl.proto import generate


def test_generated_stubs_match_the_proto(tmp_path):
    for fresh in generate.generate(tmp_path):
        committed = pathlib.Path(generate.PROTO_DIR) / fresh.name
        assert committed.read_bytes() == fresh.read_bytes(), f"{fresh.name} is stale: run python -m hfl.proto.generate"
