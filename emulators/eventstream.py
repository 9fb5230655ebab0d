"""AWS event-stream framing, pure: the encoder botocore lacks (it only decodes).

A message is a 12-byte prelude (total length, headers length, CRC32 of those 8 bytes),
the headers, the payload, and a CRC32 of everything before it. Header values here are strings
(type 7), which is all the services' `:message-type`, `:event-type`, `:exception-type` and
`:content-type` headers use.
"""

from __future__ import annotations

import binascii
import struct

import orjson

_STRING = 7


def encode_headers(headers: dict[str, str]) -> bytes:
    out = bytearray()
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        out += struct.pack(">B", len(raw_name)) + raw_name
        out += struct.pack(">BH", _STRING, len(raw_value)) + raw_value
    return bytes(out)


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    raw_headers = encode_headers(headers)
    total = 12 + len(raw_headers) + len(payload) + 4
    prelude = struct.pack(">II", total, len(raw_headers))
    prelude += struct.pack(">I", binascii.crc32(prelude))
    body = prelude + raw_headers + payload
    return body + struct.pack(">I", binascii.crc32(body))


def event(event_type: str, payload: dict[str, object]) -> bytes:
    headers = {
        ":message-type": "event",
        ":event-type": event_type,
        ":content-type": "application/json",
    }
    return encode_message(headers, orjson.dumps(payload))


def exception(
    exception_type: str, message: str, *, message_key: str = "message", **extra: object
) -> bytes:
    """An exception message; its payload's members are named as in the service's model:
    Bedrock's `message`, SageMaker's `Message` and `ErrorCode` (the SDKs read only those)."""
    headers = {
        ":message-type": "exception",
        ":exception-type": exception_type,
        ":content-type": "application/json",
    }
    return encode_message(headers, orjson.dumps({message_key: message, **extra}))
