"""A small TCP forwarder for the two-node cluster tier: `python -m tests.cluster.tcp_forward
LHOST:LPORT=THOST:TPORT ...` listens on each LHOST:LPORT and pipes every connection to THOST:TPORT, until
killed. Prints READY once every listener is up. Pure asyncio (socat is not on a fresh Debian)."""
from __future__ import annotations

import asyncio
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(256 * 1024):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


def _handler(host: str, port: int):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
    return handle


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host, int(port)


async def main(pairs: list[str]) -> None:
    servers = []
    for pair in pairs:
        listen, target = pair.split("=")
        lhost, lport = _split(listen)
        servers.append(await asyncio.start_server(_handler(*_split(target)), lhost, lport, reuse_address=True))
    print("READY", flush=True)
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
