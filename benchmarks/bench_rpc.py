"""Benchmark (not a test): CPU per device <-> edge exchange of a model-sized payload over real gRPC.

Run: python benchmarks/bench_rpc.py [--params 28938] [--exchanges 300] [--repeats 5] [--devices 1] [--profile]

One exchange is what a device does in an edge_model_sync phase: encode its float32 delta, build the
envelope, chunk it, stream it to the edge (Exchange), read the edge's reply stream, reassemble it and
decode the model; the edge side reassembles, parses and decodes the upload (refusal checks included)
and streams back a reply built once per barrier (as the edge does). Client and server are separate
processes; the CPU of both is summed (user + system, from /proc) and divided by the exchanges.

`session` is what a device does now (common/session_stream.py: each exchange framed on one EdgeService.Session
stream held open for the session); `unary` is one ExchangeOne call per exchange (what a device did before the
session stream, wire.exchange, when the upload fits one chunk, as here); `streaming` is the same code on the Exchange stream call (what every exchange was before issue 25);
`copying` is the stream call with the chunking, reassembly and decoding of before issue 12 (an extra copy per chunk,
per envelope and per tensor), in the same run. The edge side answers both calls as EdgeServer does.
--profile prints cProfile's top functions of the client side. --devices N: N devices of one client process exchange at
once, each on its own connection (as a device host's devices do), the exchanges split among them.
"""
from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import multiprocessing as mp
import os
import pstats
import statistics
import sys
import time

import numpy as np


def _copying_wire() -> None:
    """Put the pre-issue-12 copy paths back into hfl.common.wire (for the comparison only)."""
    import grpc
    from google.protobuf.message import DecodeError

    from hfl.common import wire
    from hfl.proto import hfl_v1_pb2 as pb

    def to_chunks(payload, chunk_bytes):
        view = memoryview(payload)
        if not payload:
            yield pb.Chunk(data=b"")
        for start in range(0, len(payload), chunk_bytes):
            yield pb.Chunk(data=bytes(view[start:start + chunk_bytes]))

    def chunked(envelope, chunk_bytes):
        return list(to_chunks(envelope.SerializeToString(), chunk_bytes))

    async def read_envelope(chunks, max_bytes):
        parts, size = [], 0
        try:
            async for chunk in chunks:
                size += len(chunk.data)
                if size > max_bytes:
                    raise wire.WireError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"payload exceeds the {max_bytes} byte limit",
                                         "oversized")
                parts.append(chunk.data)
        except DecodeError as exc:
            raise wire.WireError(grpc.StatusCode.INVALID_ARGUMENT, f"malformed stream message: {str(exc)[:200]}",
                                 "malformed") from None
        return wire.parse_envelope(b"".join(parts)), size

    def decode(self, tensor):
        arr = np.frombuffer(tensor.data, dtype=np.dtype(self.dtype).newbyteorder("<"))
        return arr.astype(np.float32).reshape(tuple(tensor.shape))

    wire.to_chunks, wire.chunked, wire.read_envelope = to_chunks, chunked, read_envelope
    wire.CODECS.get("float32").__class__.decode = decode


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def serve(port_q, cmd_q, mode: str, dim: int, chunk_bytes: int) -> None:
    import grpc

    if mode == "copying":
        _copying_wire()
    from hfl.common import rpc, wire
    from hfl.proto import hfl_v1_pb2 as pb
    from hfl.proto import hfl_v1_pb2_grpc as pbg

    reply_env = pb.Envelope(meta=pb.Meta(run_id="bench", sender_id="edge-000"),
                            tensors=[wire.encode(np.ones(dim, np.float32), "float32", "model")])

    class Edge(pbg.EdgeServiceServicer):
        async def Exchange(self, request_iterator, context):
            envelope, _ = await wire.read_envelope(request_iterator, 64 << 20)
            wire.decode_vector(wire.single_tensor(envelope, "delta"), dim)
            for chunk in reply:
                yield chunk

        @rpc.raw_bytes
        async def ExchangeOne(self, request, context):  # as EdgeServer: the request's bytes, the values read in place
            envelope, _ = wire.read_raw_chunk(request, 64 << 20)
            vec = wire.decode_vector(wire.single_tensor(envelope, "delta"), dim)
            del envelope
            wire.view_in(vec, request)
            return wire.whole_bytes(reply)

        @rpc.raw_bytes
        async def Session(self, request_iterator, context):  # as EdgeServer: each upload read in place, framed reply
            from hfl.common import session_stream

            async for upload in session_stream.uploads(request_iterator, 64 << 20):
                envelope, _ = await upload.read()
                vec = wire.decode_vector(wire.single_tensor(envelope, "delta"), dim)
                del envelope
                wire.view_in(vec, upload.received)
                yield session_stream.reply(wire.whole_bytes(reply))

        async def malformed(self, context):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed")

    async def main():
        global reply
        reply = wire.chunked(reply_env, chunk_bytes)  # built once per barrier, as the edge does
        server = grpc.aio.server(options=rpc.message_options(chunk_bytes))
        edge = Edge()
        rpc.add_servicer(pbg.add_EdgeServiceServicer_to_server, edge, server, edge.malformed)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_q.put(port)
        while True:
            cmd = await asyncio.get_running_loop().run_in_executor(None, cmd_q.get)
            if cmd == "cpu":
                port_q.put(_cpu())
            else:
                break
        await server.stop(0)

    asyncio.run(main())


async def client_exchanges(mode: str, port: int, n: int, dim: int, chunk_bytes: int, server_cpu,
                           profile: cProfile.Profile | None = None, devices: int = 1):
    from hfl.common import rpc, wire
    from hfl.common.pipeline import Link
    from hfl import families  # noqa: F401
    from hfl.common import config as config_mod
    from hfl.proto import hfl_v1_pb2 as pb
    from hfl.proto import hfl_v1_pb2_grpc as pbg

    cfg = config_mod.load(None, [])
    uplink, downlink = Link.from_config(cfg.pipeline, "uplink"), Link.from_config(cfg.pipeline, "downlink")
    chans = [rpc.channel(f"127.0.0.1:{port}", chunk_bytes) for _ in range(devices)]  # a device: its own connection
    stubs = [wire.edge_stub(c) for c in chans]
    delta = np.random.default_rng(0).normal(size=dim).astype(np.float32)
    from hfl.common.session_stream import SessionStream

    streams = [SessionStream() for _ in range(devices)]

    async def one(i: int, d: int = 0) -> None:
        stub, stream = stubs[d], streams[d]
        tensor, transforms = uplink.send(delta, "delta", 0, 1, i, 0)
        meta = pb.Meta(run_id="bench", round=i, phase="edge_model_sync", step=0, sender_id="dev-00001",
                       num_samples=100, transforms=transforms, num_devices=1)
        envelope = pb.Envelope(meta=meta, tensors=[tensor], scalars={"train_loss": 0.5})
        if mode == "session":
            reply = await stream.exchange(stub, wire.chunked(envelope, chunk_bytes), 64 << 20, (), "token")
        elif mode == "unary":
            reply = await wire.exchange(stub, envelope, chunk_bytes, 64 << 20)
        else:
            reply, _ = await wire.read_envelope(stub.Exchange(iter(wire.chunked(envelope, chunk_bytes))), 64 << 20)
        downlink.receive(wire.single_tensor(reply, "model"), dim, 0, 1, i, 0)

    async def device(d: int, count: int) -> None:
        for i in range(count):
            await one(i, d)

    await asyncio.gather(*(device(d, 20) for d in range(devices)))  # warm-up: connections, allocators
    s0 = server_cpu()
    if profile:
        profile.enable()
    start = _cpu()
    wall = time.perf_counter()
    await asyncio.gather(*(device(d, n // devices) for d in range(devices)))
    cpu, wall = _cpu() - start, time.perf_counter() - wall
    if profile:
        profile.disable()
    s1 = server_cpu()
    for stream in streams:
        stream.close()
    for chan in chans:
        await chan.close()
    return cpu, s1 - s0, wall


def measure(mode: str, dim: int, n: int, chunk_bytes: int, profile: bool = False, devices: int = 1) -> dict:
    ctx = mp.get_context("spawn")
    q, cmd = ctx.Queue(), ctx.Queue()
    server = ctx.Process(target=serve, args=(q, cmd, mode, dim, chunk_bytes), daemon=True)
    server.start()
    port = q.get(timeout=60)
    if mode == "copying":
        _copying_wire()
    prof = cProfile.Profile() if profile else None

    def server_cpu() -> float:
        cmd.put("cpu")
        return q.get(timeout=30)

    n = n // devices * devices
    cpu, server_cpu, wall = asyncio.run(client_exchanges(mode, port, n, dim, chunk_bytes, server_cpu, prof,
                                                         devices))
    cmd.put("stop")
    server.join(10)
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    return {"mode": mode, "devices": devices, "client_ms": 1000 * cpu / n, "server_ms": 1000 * server_cpu / n,
            "total_ms": 1000 * (cpu + server_cpu) / n, "wall_ms": 1000 * wall / n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", type=int, default=28_938, help="float32 values per message (mnist-cnn: 28,938 = 116 KB)")
    ap.add_argument("--exchanges", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--chunk-kib", type=int, default=1024)
    ap.add_argument("--profile", action="store_true", help="cProfile the client side of one `session` run")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--devices", type=int, default=1, help="devices exchanging at once in one client process, each on its "
                    "own connection (a device host's share), the exchanges split among them")
    args = ap.parse_args()
    chunk = args.chunk_kib * 1024
    if args.profile:
        print(json.dumps(measure("session", args.params, args.exchanges, chunk, profile=True, devices=args.devices)))
        return 0
    runs = {"session": [], "unary": [], "streaming": [], "copying": []}
    for r in range(args.repeats):  # alternate, so that all see the same machine load
        for mode in ("copying", "streaming", "unary", "session"):
            runs[mode].append(measure(mode, args.params, args.exchanges, chunk, devices=args.devices))
            print(json.dumps(runs[mode][-1]), flush=True)
    report = {m: {k: statistics.median(x[k] for x in rs) for k in ("client_ms", "server_ms", "total_ms", "wall_ms")}
              for m, rs in runs.items()}
    report["payload_bytes"] = 4 * args.params
    report["ratio_total"] = report["session"]["total_ms"] / report["copying"]["total_ms"]
    report["ratio_unary"] = statistics.median(c["total_ms"] / s["total_ms"] for c, s in zip(runs["session"], runs["unary"]))
    load = os.getloadavg()
    print(f"per exchange of {4 * args.params / 1000:.0f} KB up + {4 * args.params / 1000:.0f} KB down, CPU of both ends "
          f"(median of {args.repeats}): copying {report['copying']['total_ms']:.2f} ms "
          f"(device {report['copying']['client_ms']:.2f}, edge {report['copying']['server_ms']:.2f}), "
          f"session {report['session']['total_ms']:.2f} ms (device {report['session']['client_ms']:.2f}, "
          f"edge {report['session']['server_ms']:.2f}); ratio {report['ratio_total']:.2f}; unary "
          f"{report['unary']['total_ms']:.2f} ms (device {report['unary']['client_ms']:.2f}, edge "
          f"{report['unary']['server_ms']:.2f}), session / unary {report['ratio_unary']:.2f} (median of the "
          f"repeats' ratios); streaming {report['streaming']['total_ms']:.2f} ms; load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, **report}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
