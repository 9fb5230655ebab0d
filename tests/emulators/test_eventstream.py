from __future__ import annotations

import binascii
import struct

from botocore.eventstream import EventStreamBuffer

from emulators.eventstream import encode_message, event, exception


def decode(data: bytes) -> list[tuple[dict[str, object], bytes]]:
    buffer = EventStreamBuffer()
    buffer.add_data(data)
    return [(m.headers, m.payload) for m in buffer]


def test_botocore_decodes_what_we_encode() -> None:
    data = event("contentBlockDelta", {"delta": {"text": "Hi"}, "contentBlockIndex": 0})
    data += exception("throttlingException", "slow down")
    (h1, p1), (h2, p2) = decode(data)
    assert h1 == {
        ":message-type": "event",
        ":event-type": "contentBlockDelta",
        ":content-type": "application/json",
    }
    assert p1 == b'{"delta":{"text":"Hi"},"contentBlockIndex":0}'
    assert h2[":exception-type"] == "throttlingException"
    assert p2 == b'{"message":"slow down"}'


def test_layout_and_crcs_byte_by_byte() -> None:
    msg = encode_message({"a": "b"}, b"xy")
    headers = b"\x01a\x07\x00\x01b"
    assert struct.unpack(">II", msg[:8]) == (12 + len(headers) + 2 + 4, len(headers))
    assert struct.unpack(">I", msg[8:12])[0] == binascii.crc32(msg[:8])
    assert msg[12 : 12 + len(headers)] == headers
    assert msg[12 + len(headers) : -4] == b"xy"
    assert struct.unpack(">I", msg[-4:])[0] == binascii.crc32(msg[:-4])


def test_decodes_when_split_anywhere() -> None:
    data = b"".join(event("e", {"i": i}) for i in range(3))
    for cut in range(1, len(data)):
        buffer = EventStreamBuffer()
        buffer.add_data(data[:cut])
        got = [m.payload for m in buffer]
        buffer.add_data(data[cut:])
        got += [m.payload for m in buffer]
        assert got == [b'{"i":0}', b'{"i":1}', b'{"i":2}']
