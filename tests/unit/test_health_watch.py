"""common/rpc.py's health service and wait_serving on real gRPC: a node waiting for its upstream hears SERVING as it
is set (a Watch stream, no poll interval), also when another watch on the same server ended while it waited."""
import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hfl.common import rpc


async def _server() -> rpc.Server:
    server = rpc.Server("127.0.0.1:0", 1 << 20)
    await server.start()
    return server


def test_waiters_hear_serving_at_once_after_another_watch_ended():
    async def main():
        server = await _server()
        channels = [rpc.channel(server.address, 1 << 20) for _ in range(3)]
        try:
            waiters = [asyncio.create_task(rpc.wait_serving(c, 30, "test server")) for c in channels[:2]]
            ended = health_pb2_grpc.HealthStub(channels[2]).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await ended.read()).status == rpc.NOT_SERVING
            await asyncio.sleep(0.3)  # every watch is waiting on the server
            ended.cancel()  # grpcio's aio servicer drops the condition the other two wait on here
            await asyncio.sleep(0.3)
            assert not any(w.done() for w in waiters)
            set_at = time.monotonic()
            await server.ready()
            await asyncio.wait_for(asyncio.gather(*waiters), 10)
            return time.monotonic() - set_at
        finally:
            for c in channels:
                await c.close()
            await server.stop(0)

    assert asyncio.run(main()) < 1.0  # a 0.2 s poll would also pass; a lost notification waits out the 30 s


def test_check_follows_set_and_graceful_shutdown_is_final():
    async def main():
        server = await _server()
        chan = rpc.channel(server.address, 1 << 20)
        stub = health_pb2_grpc.HealthStub(chan)
        statuses = []
        try:
            for step in (None, server.ready, server.health.enter_graceful_shutdown, server.ready):
                if step is not None:
                    await step()
                statuses.append((await stub.Check(health_pb2.HealthCheckRequest(service=""))).status)
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await stub.Check(health_pb2.HealthCheckRequest(service="other"))
            watch = stub.Watch(health_pb2.HealthCheckRequest(service="other"))
            first = (await watch.read()).status
            watch.cancel()
            return statuses, unknown.value.code(), first
        finally:
            await chan.close()
            await server.stop(0)

    statuses, unknown, first = asyncio.run(main())
    assert statuses == [rpc.NOT_SERVING, rpc.SERVING, rpc.NOT_SERVING, rpc.NOT_SERVING]
    assert unknown == grpc.StatusCode.NOT_FOUND
    assert first == health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


def test_wait_serving_on_an_address_nobody_serves_times_out_with_the_reason():
    async def main():
        chan = rpc.channel("127.0.0.1:1", 1 << 20)
        try:
            await rpc.wait_serving(chan, 1.0, "cloud 127.0.0.1:1")
        finally:
            await chan.close()

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"cloud 127.0.0.1:1 not SERVING after 1s \((UNAVAILABLE|DEADLINE)"):
        asyncio.run(main())
    assert time.monotonic() - started < 5
