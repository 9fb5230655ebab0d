"""SageMaker bidirectional streaming through the real HTTP/2 SDK (its serialization, event
signing and deserialization), bridged through its transport seam to the model server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest
import pytest_asyncio

from emulators.sagemaker_bidi import BidiScript, SeamTransport
from gateway.errors import TTSError
from gateway.transports.base import TimedWords
from gateway.transports.sagemaker_bidi import SageMakerBidiTransport
from tests.support.fakes import expected_pcm_bytes
from tests.support.servers import RunningServer

BIDI = "/invocations-bidirectional-stream"


@pytest_asyncio.fixture(loop_scope="session")
async def bidi(
    aws_env: None, fake_server: RunningServer
) -> AsyncIterator[tuple[SageMakerBidiTransport, SeamTransport]]:
    seam = SeamTransport(fake_server.ws_url + BIDI, BidiScript())
    transport = SageMakerBidiTransport("kokoro-tts", "us-east-1", http_transport=seam)
    yield transport, seam
    await transport.close()


async def speak(
    transport: SageMakerBidiTransport, chunks: list[str], voice: str | None = None
) -> bytes:
    async with transport.open(voice, 1.0) as session:
        for chunk in chunks:
            await session.send(chunk)
        await session.end_input()
        return b"".join([pcm async for pcm in session.audio() if isinstance(pcm, bytes)])


async def test_every_chunk_on_one_stream_as_binary_frames(
    bidi: tuple[SageMakerBidiTransport, SeamTransport],
) -> None:
    transport, seam = bidi
    pcm = await speak(transport, ["Hello there.", "This is a post deployment check."])
    assert len(pcm) == expected_pcm_bytes("Hello there.") + expected_pcm_bytes(
        "This is a post deployment check."
    )
    assert seam.script.streams == 1
    kinds = [kind for kind, _ in seam.script.container_messages]
    assert kinds == ["binary", "binary", "binary"]  # two requests, then close
    assert orjson.loads(seam.script.container_messages[-1][1]) == {"type": "close"}
    (request,) = seam.requests
    assert request.destination.path == "/endpoints/kokoro-tts/invocations-bidirectional-stream"
    assert request.destination.port == 8443
    auth = request.fields["authorization"].values[0]
    assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/us-east-1/sagemaker/aws4_request" in auth


async def test_model_server_errors_end_the_reply(
    bidi: tuple[SageMakerBidiTransport, SeamTransport],
) -> None:
    transport, _ = bidi
    with pytest.raises(TTSError) as failure:
        await speak(transport, ["Hello there."], voice="nobody")
    assert failure.value.code == "tts_unknown_voice"
    assert len(await speak(transport, ["Again."])) > 0  # the next stream works


async def test_unknown_endpoint_names_the_setting(
    aws_env: None, fake_server: RunningServer
) -> None:
    seam = SeamTransport(fake_server.ws_url + BIDI, BidiScript())
    transport = SageMakerBidiTransport("no-such-endpoint", "us-east-1", http_transport=seam)
    with pytest.raises(TTSError, match="GATEWAY_SAGEMAKER_ENDPOINT"):
        await speak(transport, ["Hello there."])
    await transport.close()


async def test_a_container_close_reaches_the_caller_as_model_stream_error(
    bidi: tuple[SageMakerBidiTransport, SeamTransport],
) -> None:
    transport, _ = bidi
    with pytest.raises(TTSError) as failure:
        await close_then_listen(transport)
    assert failure.value.code == "tts_ModelStreamError"
    assert failure.value.retryable is True


async def close_then_listen(transport: SageMakerBidiTransport) -> None:
    async with transport.open(None, 1.0) as session:
        await session.close()  # the container closes its socket while our input is open
        async for _ in session.audio():
            pass


async def test_word_timings_cross_the_bidirectional_stream(
    bidi: tuple[SageMakerBidiTransport, SeamTransport],
) -> None:
    """word_timings are text frames among the binary audio: the frame rule tells them apart
    on the way back, and each request's words are placed where its audio starts."""
    transport, seam = bidi
    async with transport.open(None, 1.0, timestamps=True) as session:
        for chunk in ("Hello there.", "How are you?"):
            await session.send(chunk)
        await session.end_input()
        pieces = [piece async for piece in session.audio()]
    words = [w for p in pieces if isinstance(p, TimedWords) for w in p.words]
    assert [w.word for w in words] == ["Hello", "there.", "How", "are", "you?"]
    first = expected_pcm_bytes("Hello there.") / 48_000  # seconds of the first request
    assert words[2].start == pytest.approx(first)  # the second request starts after it
    assert all(orjson.loads(m[1]).get("timestamps") for m in seam.script.container_messages[:2])
