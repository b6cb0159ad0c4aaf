"""Benchmark (not a test): gRPC's own cost of a unary call against a message on a held bidirectional stream, in
grpc.aio with no project code (a generic handler, bytes both ways). Run: python benchmarks/bench_grpc_stream.py [N]

The client sends N requests of 116 KB (random bytes) and gets 100 bytes back, either as N unary calls or as N
write/read pairs on one stream_stream call; printed for unary, bidi, unary, bidi in turn: the client's CPU per
message (user + system), the server's CPU per message and the wall time per message. It is the floor under
bench_rpc.py's `unary` and `session` modes (common/session_stream.py holds such a stream per device).
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import sys
import time

import grpc

SIZE = 116_000
WARM_UP = 20


def _same(b: bytes) -> bytes:
    return b


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


async def _serve(port_q, stop_q) -> None:
    async def unary(request, context):
        return request[:100]

    async def bidi(requests, context):
        async for request in requests:
            yield request[:100]

    handler = grpc.method_handlers_generic_handler("x.X", {
        "U": grpc.unary_unary_rpc_method_handler(unary, request_deserializer=_same, response_serializer=_same),
        "B": grpc.stream_stream_rpc_method_handler(bidi, request_deserializer=_same, response_serializer=_same)})
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    server.add_generic_rpc_handlers((handler,))
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    await server.start()
    port_q.put(_cpu())
    await asyncio.get_running_loop().run_in_executor(None, stop_q.get)
    port_q.put(_cpu())
    await server.stop(0)


def serve(port_q, stop_q) -> None:
    asyncio.run(_serve(port_q, stop_q))


async def client(port: int, mode: str, n: int) -> tuple[float, float]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)])
    payload = os.urandom(SIZE)
    unary = channel.unary_unary("/x.X/U", request_serializer=_same, response_deserializer=_same)
    bidi = channel.stream_stream("/x.X/B", request_serializer=_same, response_deserializer=_same)
    for _ in range(WARM_UP):
        await unary(payload)
    cpu, wall = _cpu(), time.perf_counter()
    if mode == "unary":
        for _ in range(n):
            await unary(payload)
    else:
        call = bidi()
        for _ in range(n):
            await call.write(payload)
            await call.read()
        await call.done_writing()
    cpu, wall = _cpu() - cpu, time.perf_counter() - wall
    await channel.close()
    return cpu, wall


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    for mode in ("unary", "bidi", "unary", "bidi"):
        port_q, stop_q = mp.Queue(), mp.Queue()
        proc = mp.Process(target=serve, args=(port_q, stop_q))
        proc.start()
        port = port_q.get()
        server_started = port_q.get()
        cpu, wall = asyncio.run(client(port, mode, n))
        stop_q.put(1)
        server_cpu = port_q.get() - server_started  # includes the warm-up calls
        proc.join()
        print(f"{mode}: client {1000 * cpu / n:.3f} ms a message, server {1000 * server_cpu / (n + WARM_UP):.3f}, "
              f"wall {1000 * wall / n:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
