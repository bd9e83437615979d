"""The byte format of the lane (:mod:`daskqueue.queue.lane`): a client's small calls to a
queue actor over a plain TCP connection, beside Dask's comm.

A connection starts with the client's hello: ``HELLO`` then the lane's secret (what the
actor gave the client through a Dask call, so that only a client of the pool can put
through it). Then frames, both ways, each a ``HEADER`` and a body:

* a request: ``HEADER(body length, request id, method code)``, then the arguments, each a
  tag byte and its value (``b`` u32 length + bytes, ``s`` u32 length + UTF-8, ``i`` i64,
  ``f`` f64, ``n`` None). No pickle: the actor's side never unpickles what a connection
  sends it.
* a reply: ``HEADER(body length, request id, status)``, then for ``OK`` the pickle of the
  method's return value, for ``ERROR`` the pickle of its exception, for ``FALLBACK``
  nothing: the client makes the same call through Dask instead. Request id 0 with
  ``FALLBACK`` is the actor's goodbye: it stops serving the lane, every call in flight on
  that connection goes through Dask.

Little-endian throughout. Nothing here imports Dask.
"""

from __future__ import annotations

import struct
from typing import Any

__all__ = [
    "HELLO", "SECRET_BYTES", "HEADER", "METHODS", "METHOD_CODES", "CLIENT_METHODS", "WORKER_METHODS",
    "OK", "ERROR", "FALLBACK", "GOODBYE_ID",
    "MAX_FRAME_BYTES", "LaneProtocolError", "encode_request", "decode_args", "encode_reply",
]

#: The first bytes of a connection, before the secret.
HELLO = b"DQLANE1\n"
SECRET_BYTES = 16

#: body length (u32, bytes after the header), request id (u32), method code or status (u8).
HEADER = struct.Struct("<IIB")

#: The methods a lane carries (code -> name). A client's (:mod:`daskqueue.queue.lane`): those
#: it waits on per task, both safe to send again through Dask when the lane fails (a put
#: carries its token: a queue that stored it answers with the ids it gave; a fetch is
#: read-only below its cursors). A worker's (:mod:`daskqueue.queue.worker_lane`): a
#: consumer's fetch and settle at a queue on another worker, and a queue's announcement to
#: its peers; never sent again (a failure after the request went out is the call's).
METHODS = {1: "put_batch", 2: "fetch_outcomes", 3: "get_batch", 4: "settle", 5: "work_at"}
CLIENT_METHODS = frozenset({"put_batch", "fetch_outcomes"})
WORKER_METHODS = frozenset({"get_batch", "settle", "work_at"})
METHOD_CODES = {name: code for code, name in METHODS.items()}

OK, ERROR, FALLBACK = 0, 1, 2
GOODBYE_ID = 0

#: A frame longer than this is a broken connection, never a call (a lane carries small puts).
MAX_FRAME_BYTES = 1 << 30

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")


class LaneProtocolError(Exception):
    """Bytes on a lane that are not a frame of this format (internal: the connection ends)."""


def encode_request(request_id: int, code: int, args: tuple[Any, ...]) -> bytes | None:
    """A request frame, or None if an argument has no encoding here (the caller uses Dask)."""
    parts = []
    for a in args:
        if isinstance(a, (bytes, bytearray, memoryview)):
            parts += (b"b", _U32.pack(len(a)), a)
        elif type(a) is str:
            data = a.encode("utf-8", "surrogatepass")
            parts += (b"s", _U32.pack(len(data)), data)
        elif isinstance(a, bool):
            return None  # would come back as an int
        elif isinstance(a, int):
            if not -(1 << 63) <= a < (1 << 63):
                return None
            parts += (b"i", _I64.pack(a))
        elif isinstance(a, float):
            parts += (b"f", _F64.pack(a))
        elif a is None:
            parts.append(b"n")
        else:
            return None
    body = b"".join(parts)
    return HEADER.pack(len(body), request_id, code) + body


def decode_args(body: bytes | memoryview) -> tuple[Any, ...]:
    """The arguments of a request body; :class:`LaneProtocolError` if they are not well formed."""
    view = memoryview(body)
    args: list[Any] = []
    pos, end = 0, len(view)
    try:
        while pos < end:
            tag = view[pos]
            pos += 1
            if tag == 0x62:  # b
                (n,) = _U32.unpack_from(view, pos)
                pos += 4
                if pos + n > end:
                    raise LaneProtocolError("bytes argument runs past its frame")
                args.append(bytes(view[pos : pos + n]))
                pos += n
            elif tag == 0x73:  # s
                (n,) = _U32.unpack_from(view, pos)
                pos += 4
                if pos + n > end:
                    raise LaneProtocolError("str argument runs past its frame")
                try:
                    args.append(str(view[pos : pos + n], "utf-8", "surrogatepass"))
                except UnicodeDecodeError:
                    raise LaneProtocolError("str argument is not UTF-8") from None
                pos += n
            elif tag == 0x69:  # i
                args.append(_I64.unpack_from(view, pos)[0])
                pos += 8
            elif tag == 0x66:  # f
                args.append(_F64.unpack_from(view, pos)[0])
                pos += 8
            elif tag == 0x6E:  # n
                args.append(None)
            else:
                raise LaneProtocolError(f"unknown argument tag {tag:#x}")
    except struct.error as e:
        raise LaneProtocolError(f"argument cut short: {e}") from None
    return tuple(args)


def encode_reply(request_id: int, status: int, body: bytes = b"") -> bytes:
    """A reply frame."""
    return HEADER.pack(len(body), request_id, status) + body
