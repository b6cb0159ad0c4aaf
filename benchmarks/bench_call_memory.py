"""Benchmark (not a test): memory a device <-> edge exchange holds while the edge's barrier waits, per call.

    python benchmarks/bench_call_memory.py [--calls 300] [--params 28938] [--certs DIR] [--calls-kind unary raw stream]

One client process opens --calls channels (each its own connection; under --certs each with its own device key and
certificate, as a per-core device host does) and sends one model-sized upload on each; a server process (the edge)
reads each upload, keeps its values and holds every call until all have arrived, then answers them all with one
shared reply. Reported: USS per call of the server while it holds them, of the client while they are in flight,
and of the client once they are done (heap trimmed first, as the nodes trim theirs). Kinds: `unary` is ExchangeOne
with generated (de)serializers and a copy of the values (what the edge did before issue 25's change), `raw` is
ExchangeOne as the edge serves it now (rpc.raw_bytes: request and reply as bytes, the values read in place,
wire.view_in) with the device's edge_stub, `stream` is the Exchange stream call.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import pathlib
import subprocess
import sys

import numpy as np
import psutil

SERVICE = "/hfl.v1.EdgeService/"


def _uss_kib(per: int, base: int) -> float:
    from hfl.common import heap

    gc.collect()
    heap.trim_now()
    return (psutil.Process().memory_full_info().uss - base) / per / 1024


async def serve(calls: int, params: int, certs: str | None) -> None:
    import grpc

    from hfl.common import rpc, wire
    from hfl.proto import hfl_v1_pb2 as pb

    held, arrived, release = [], [0], asyncio.Event()
    reply = wire.chunked(pb.Envelope(tensors=[wire.encode(np.ones(params, np.float32), "float32", "model")]), 1 << 24)

    async def hold(vec):
        held.append(vec)
        arrived[0] += 1
        await release.wait()

    async def unary(request, context):
        envelope, _ = wire.read_chunk(request, 1 << 26)
        await hold(wire.decode_vector(envelope.tensors[0], params))
        return wire.whole(reply)

    async def raw(request, context):
        envelope, _ = wire.read_raw_chunk(request, 1 << 26)
        vec = wire.decode_vector(envelope.tensors[0], params)
        del envelope
        await hold(wire.view_in(vec, request))
        return wire.whole_bytes(reply)

    async def stream(request_iterator, context):
        envelope, _ = await wire.read_envelope(request_iterator, 1 << 26)
        vec = wire.decode_vector(envelope.tensors[0], params)
        del envelope
        await hold(vec)
        for chunk in reply:
            yield chunk

    chunk = dict(request_deserializer=pb.Chunk.FromString, response_serializer=pb.Chunk.SerializeToString)
    handler = grpc.method_handlers_generic_handler("hfl.v1.EdgeService", {
        "ExchangeOne": grpc.unary_unary_rpc_method_handler(unary, **chunk),
        "ExchangeRaw": grpc.unary_unary_rpc_method_handler(raw),
        "Exchange": grpc.stream_stream_rpc_method_handler(stream, **chunk)})
    server = grpc.aio.server(options=rpc.message_options(1 << 24))
    server.add_generic_rpc_handlers((handler,))
    if certs:
        key, cert, ca = (pathlib.Path(certs, p).read_bytes() for p in ("nodes/edge-000.key", "nodes/edge-000.pem", "ca.pem"))
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                                                                 require_client_auth=True))
    else:
        port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    gc.collect()
    base = psutil.Process().memory_full_info().uss
    print(port, flush=True)
    while arrived[0] < calls:
        await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    print(f"{_uss_kib(calls, base):.1f}", flush=True)
    await asyncio.sleep(4.0)  # the client measures meanwhile
    release.set()
    await asyncio.sleep(2.0)
    await server.stop(1)


async def client(kind: str, calls: int, params: int, certs: str | None) -> dict:
    import grpc

    from hfl.common import rpc, wire
    from hfl.proto import hfl_v1_pb2 as pb

    args = [sys.executable, __file__, "--serve", "--calls", str(calls), "--params", str(params)]
    server = subprocess.Popen(args + (["--certs", certs] if certs else []), stdout=subprocess.PIPE, text=True)
    port = int(server.stdout.readline())
    gc.collect()
    base = psutil.Process().memory_full_info().uss
    channels = []
    for i in range(calls):
        if certs:
            d = pathlib.Path(certs)
            creds = grpc.ssl_channel_credentials((d / "ca.pem").read_bytes(), (d / f"devices/dev-{i:05d}.key").read_bytes(),
                                                 (d / f"devices/dev-{i:05d}.pem").read_bytes())
            channels.append(rpc.channel(f"127.0.0.1:{port}", 1 << 24, creds, "edge.hfl"))
        else:
            channels.append(rpc.channel(f"127.0.0.1:{port}", 1 << 24))
    envelope = pb.Envelope(meta=pb.Meta(sender_id="dev-00000"),
                           tensors=[wire.encode(np.ones(params, np.float32), "float32", "delta")])

    async def call(chan):
        chunks = wire.chunked(envelope, 1 << 24)
        if kind == "raw":
            stub = wire.edge_stub(chan)
            stub.ExchangeOne = chan.unary_unary(SERVICE + "ExchangeRaw")
            return await wire.exchange_chunks(stub, chunks, 1 << 26)
        if kind == "unary":
            call = chan.unary_unary(SERVICE + "ExchangeOne", request_serializer=pb.Chunk.SerializeToString,
                                    response_deserializer=pb.Chunk.FromString)
            return wire.read_chunk(await call(chunks.pop()), 1 << 26)[0]
        call = chan.stream_stream(SERVICE + "Exchange", request_serializer=pb.Chunk.SerializeToString,
                                  response_deserializer=pb.Chunk.FromString)
        return (await wire.read_envelope(call(iter(chunks)), 1 << 26))[0]

    tasks = [asyncio.ensure_future(call(c)) for c in channels]
    server_kib = float(await asyncio.get_running_loop().run_in_executor(None, server.stdout.readline))
    await asyncio.sleep(1.0)
    if any(t.done() for t in tasks):
        raise RuntimeError("a call ended before the measurement: " + repr(next(t for t in tasks if t.done()).exception()))
    in_flight = _uss_kib(calls, base)
    await asyncio.gather(*tasks)
    done = _uss_kib(calls, base)
    server.wait()
    for chan in channels:
        await chan.close()
    return {"server_kib": server_kib, "client_in_flight_kib": in_flight, "client_after_kib": done}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--params", type=int, default=28938, help="float32 values an upload carries (mnist-cnn)")
    ap.add_argument("--certs", help="a CA directory with nodes/edge-000.* and devices/dev-NNNNN.* (bench_tls.py's)")
    ap.add_argument("--kinds", nargs="+", default=["unary", "raw", "stream"], choices=["unary", "raw", "stream"])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        asyncio.run(serve(args.calls, args.params, args.certs))
        return
    print(f"{args.calls} calls of {args.params * 4 / 1024:.0f} KiB, {'mutual TLS' if args.certs else 'plaintext'}; "
          "USS per call, KiB")
    for kind in args.kinds:
        out = asyncio.run(client(kind, args.calls, args.params, args.certs))
        print(f"  {kind:6s} edge while held {out['server_kib']:6.1f}   device in flight "
              f"{out['client_in_flight_kib']:6.1f}   device after {out['client_after_kib']:6.1f}", flush=True)


if __name__ == "__main__":
    main()
