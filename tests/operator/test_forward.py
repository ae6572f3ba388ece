"""The node part's TCP forwarder (stack/eos_stack/forward.py): bad mappings named, bytes relayed both ways."""
from __future__ import annotations

import asyncio

import pytest

from eos_stack import forward


def test_bad_mapping_names_the_form():
    with pytest.raises(ValueError, match="LISTEN_IP:PORT=TARGET_IP:PORT"):
        forward.parse("10.0.0.1:80")
    assert forward.parse("10.243.1.1:6443=127.0.0.1:6443") == (("10.243.1.1", 6443), ("127.0.0.1", 6443))


def test_relays_both_ways_and_closes_when_the_client_does():
    async def scenario() -> tuple[bytes, bytes]:
        got = []

        async def echo(reader, writer):
            data = await reader.read(100)
            got.append(data)
            writer.write(data.upper())
            await writer.drain()
            writer.close()

        target = await asyncio.start_server(echo, "127.0.0.1", 0)
        tport = target.sockets[0].getsockname()[1]
        relay = await forward._serve(("127.0.0.1", 0), ("127.0.0.1", tport))
        rport = relay.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", rport)
        writer.write(b"hello")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)      # to EOF: the target closed, the relay too
        writer.close()
        relay.close()
        target.close()
        return got[0], answer

    sent, answer = asyncio.run(scenario())
    assert (sent, answer) == (b"hello", b"HELLO")
