"""NRI's wire: ttrpc messages inside NRI's multiplexer, over one Unix socket.

Facts from the sources (NRI 0.8 pkg/net/multiplex, ttrpc 1.2 channel.go), written here once:

- The multiplexer frames every write of a logical connection as a big-endian header
  (connection id: uint32, payload length: uint32) and the payload. Connection 1 carries the
  plugin's service (the runtime calls it), connection 2 the runtime's (the plugin calls it);
  0 is reserved. One logical write can be split over several frames, and a frame need not
  hold a whole ttrpc message: each connection is a byte stream.
- A ttrpc message is a 10-byte big-endian header (length: uint32, stream id: uint32, type:
  uint8, flags: uint8) and `length` bytes; length at most 4 MiB. Type 1 is a request
  (payload: ttrpc.Request), 2 a response (ttrpc.Response), 3 data (streams: unused by NRI's
  unary calls). A client's stream ids are odd, increasing; a unary request carries the
  remote-closed flag.

This module is framing only (bytes in, messages out): the plugin (plugin.py) drives it.
"""

from __future__ import annotations

import struct

PLUGIN_CONN = 1  # the plugin's service: Configure, Synchronize, CreateContainer...
RUNTIME_CONN = 2  # the runtime's service: RegisterPlugin, UpdateContainers

MUX_HEADER = struct.Struct(">II")  # connection id, payload length
TTRPC_HEADER = struct.Struct(">IIBB")  # length, stream id, type, flags
TTRPC_MAX = 4 << 20  # ttrpc's messageLengthMax
MUX_MAX = TTRPC_HEADER.size + TTRPC_MAX  # the multiplexer's largest frame payload

REQUEST, RESPONSE, DATA = 1, 2, 3
FLAG_REMOTE_CLOSED = 0x1


class WireError(ValueError):
    """The peer broke the protocol: the connection cannot go on."""


class Message:
    __slots__ = ("conn", "stream", "type", "flags", "payload")

    def __init__(self, conn: int, stream: int, type: int, flags: int, payload: bytes) -> None:
        self.conn, self.stream, self.type, self.flags, self.payload = conn, stream, type, flags, payload

    def __repr__(self) -> str:
        return f"Message(conn={self.conn}, stream={self.stream}, type={self.type}, {len(self.payload)} bytes)"


def encode(conn: int, stream: int, type: int, flags: int, payload: bytes) -> bytes:
    """One ttrpc message on logical connection `conn`, in multiplexer frames."""
    if len(payload) > TTRPC_MAX:
        raise WireError(f"message of {len(payload)} bytes is over ttrpc's {TTRPC_MAX}")
    data = TTRPC_HEADER.pack(len(payload), stream, type, flags) + payload
    out = []
    for i in range(0, len(data), MUX_MAX):
        chunk = data[i : i + MUX_MAX]
        out.append(MUX_HEADER.pack(conn, len(chunk)) + chunk)
    return b"".join(out)


class Decoder:
    """Bytes from the trunk in (feed), whole ttrpc messages out, per logical connection.
    Frames for a connection nobody opened are dropped, as NRI's multiplexer drops them."""

    def __init__(self, conns: tuple[int, ...] = (PLUGIN_CONN, RUNTIME_CONN)) -> None:
        self._trunk = bytearray()
        self._streams = {c: bytearray() for c in conns}

    def feed(self, data: bytes) -> list[Message]:
        self._trunk += data
        out: list[Message] = []
        while len(self._trunk) >= MUX_HEADER.size:
            conn, size = MUX_HEADER.unpack_from(self._trunk)
            if size > MUX_MAX:
                raise WireError(f"multiplexer frame of {size} bytes is over {MUX_MAX}")
            if len(self._trunk) < MUX_HEADER.size + size:
                break
            payload = bytes(self._trunk[MUX_HEADER.size : MUX_HEADER.size + size])
            del self._trunk[: MUX_HEADER.size + size]
            buf = self._streams.get(conn)
            if buf is None:
                continue
            buf += payload
            out.extend(self._messages(conn, buf))
        return out

    @staticmethod
    def _messages(conn: int, buf: bytearray) -> list[Message]:
        out = []
        while len(buf) >= TTRPC_HEADER.size:
            length, stream, type, flags = TTRPC_HEADER.unpack_from(buf)
            if length > TTRPC_MAX:
                raise WireError(f"ttrpc message of {length} bytes is over {TTRPC_MAX}")
            if len(buf) < TTRPC_HEADER.size + length:
                break
            payload = bytes(buf[TTRPC_HEADER.size : TTRPC_HEADER.size + length])
            del buf[: TTRPC_HEADER.size + length]
            out.append(Message(conn, stream, type, flags, payload))
        return out
