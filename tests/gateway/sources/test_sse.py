from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st
from sse_starlette import ServerSentEvent

from gateway.sources.sse import SSEDecoder, SSEEvent

STREAM = (
    b": keep-alive\n\n"
    b'id: r1:0\nevent: agent_start\ndata: {"mode": "bidi"}\n\n'
    b'event: text_delta\r\ndata: {"text": "h\xc3\xa9llo"}\r\n\r\n'
    b"data: line one\rdata: line two\r\r"
    b"retry: 1500\ndata:no-space\n\n"
    b"event: ignored-without-data\n\n"
    b"data: [DONE]\n\n"
)
EXPECTED = [
    SSEEvent("agent_start", '{"mode": "bidi"}', "r1:0"),
    SSEEvent("text_delta", '{"text": "héllo"}'),
    SSEEvent("message", "line one\nline two"),
    SSEEvent("message", "no-space", retry=1500),
    SSEEvent("message", "[DONE]"),
]


def decode(chunks: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    out: list[SSEEvent] = []
    for chunk in chunks:
        out += decoder.push(chunk)
    return out + decoder.flush()


def test_whole_stream() -> None:
    assert decode([STREAM]) == EXPECTED


def test_byte_by_byte() -> None:
    assert decode([STREAM[i : i + 1] for i in range(len(STREAM))]) == EXPECTED


@given(st.sets(st.integers(0, len(STREAM)), max_size=40))
def test_any_split_points(cuts: set[int]) -> None:
    points = sorted(cuts)
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    assert decode(chunks) == EXPECTED


def test_unterminated_event_is_dropped_and_last_id_kept() -> None:
    decoder = SSEDecoder()
    assert decoder.push(b"id: 7\ndata: x\n\ndata: half") == [SSEEvent("message", "x", "7")]
    assert decoder.flush() == []
    assert decoder.last_event_id == "7"


def test_decodes_what_the_gateway_encodes() -> None:
    raw = ServerSentEvent("a\nb", event="audio_chunk", id="r:3").encode()
    assert raw == b"id: r:3\r\nevent: audio_chunk\r\ndata: a\r\ndata: b\r\n\r\n"
    assert decode([raw]) == [SSEEvent("audio_chunk", "a\nb", "r:3")]


def test_a_long_event_cut_into_many_chunks() -> None:
    """Seconds of base64 audio in one data line, read in transport-sized pieces, the CRLF
    after it cut between two of them."""
    payload = base64.b64encode(bytes(range(256)) * 4096).decode()  # 1 MiB of audio
    raw = ServerSentEvent(payload, event="audio_chunk").encode() + b"data: next\r\n\r\n"
    assert len(raw) > 1_000_000
    cut = raw.index(b"\r\n") + 1  # between the CR and the LF ending the long line
    chunks = [raw[i : i + 16_384] for i in range(0, cut, 16_384)]
    chunks[-1] = raw[(len(chunks) - 1) * 16_384 : cut]
    chunks.append(raw[cut:])
    assert decode(chunks) == [SSEEvent("audio_chunk", payload), SSEEvent("message", "next")]
