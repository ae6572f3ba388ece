"""A small TCP forwarder: listens on given addresses and relays each connection to a target, byte for byte.

For servers that bind one address only (kube-apiserver, MinIO, Kafka's listener for Pods all on 127.0.0.1):
the node part (node_services.py) runs one ``python -m eos_stack.forward LISTEN_IP:PORT=TARGET_IP:PORT ...``
daemon so Pods reach them at the stack's services address. TLS passes through untouched.
"""
from __future__ import annotations

import asyncio
import sys


def parse(spec: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``10.243.7.1:6443=127.0.0.1:6443`` -> ((listen host, port), (target host, port))."""
    try:
        listen, target = spec.split("=")
        (lh, lp), (th, tp) = listen.rsplit(":", 1), target.rsplit(":", 1)
        return (lh, int(lp)), (th, int(tp))
    except ValueError:
        raise ValueError(f"forward: bad mapping {spec!r}: write LISTEN_IP:PORT=TARGET_IP:PORT") from None


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def _serve(listen: tuple[str, int], target: tuple[str, int]) -> asyncio.Server:
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return await asyncio.start_server(relay, *listen, reuse_address=True)


async def _main(specs: list[str]) -> None:
    servers = [await _serve(*parse(s)) for s in specs]
    print("forwarding " + ", ".join(specs), flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> int:
    specs = sys.argv[1:] if argv is None else argv
    if not specs:
        print("usage: python -m eos_stack.forward LISTEN_IP:PORT=TARGET_IP:PORT ...", file=sys.stderr)
        return 2
    try:
        asyncio.run(_main(specs))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
