"""The committed stubs must be what protoc makes of proto/hfl_v1.proto today, as gencode that loads
on protobuf 6 and 7."""
import pathlib
import re
import tomllib

from hfl.proto import generate


def test_generated_stubs_match_the_proto(tmp_path):
    for fresh in generate.generate(tmp_path):
        committed = pathlib.Path(generate.PROTO_DIR) / fresh.name
        assert committed.read_bytes() == fresh.read_bytes(), f"{fresh.name} is stale: run python -m hfl.proto.generate"


def test_a_changed_proto_gives_different_stubs(tmp_path):
    proto = (generate.PROTO_DIR / generate.PROTO_FILE).read_text()
    changed = re.sub(r"(message Ack \{)", r"\1\n  string drift_probe = 99;", proto, count=1)
    assert changed != proto
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / generate.PROTO_FILE).write_text(changed)
    fresh = generate.generate(tmp_path / "out", proto_dir=tmp_path / "src")
    committed = pathlib.Path(generate.PROTO_DIR) / "hfl_v1_pb2.py"
    assert fresh[0].read_bytes() != committed.read_bytes()


def test_stubs_declare_protobuf_6_gencode_and_the_pins_agree():
    text = (generate.PROTO_DIR / "hfl_v1_pb2.py").read_text()
    check = re.search(r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),", text)
    assert check and tuple(map(int, check.groups())) == generate.GENCODE_PROTOBUF
    project = tomllib.loads((generate.PROTO_DIR.parent / "pyproject.toml").read_text())["project"]
    pins = project["dependencies"] + project["optional-dependencies"]["test"]
    assert f"grpcio-tools=={generate.GRPCIO_TOOLS}" in [p.replace(" ", "") for p in pins]
    protobuf = next(p for p in pins if p.startswith("protobuf"))
    assert protobuf.replace(" ", "") == "protobuf>=" + ".".join(map(str, generate.GENCODE_PROTOBUF)) + ",<8"


def test_stubs_load_on_the_installed_runtime():
    from google.protobuf import runtime_version

    from hfl.proto import hfl_v1_pb2

    assert runtime_version.MAJOR in (6, 7)
    assert hfl_v1_pb2.Ack(accepted=True, detail="x").SerializeToString()
