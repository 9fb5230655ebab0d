"""SageMaker InvokeEndpointWithResponseStream through the real aioboto3 client, against the
local emulator fronting the model server."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import aioboto3
import httpx
import orjson
import pytest
import pytest_asyncio
from botocore.config import Config

from emulators.sagemaker_stream import StreamScript, create_sagemaker_stream_emulator
from gateway.errors import TTSError
from gateway.transports.base import TimedWords
from gateway.transports.sagemaker_stream import SageMakerStreamTransport
from tests.support.fakes import FailingEngine, expected_pcm_bytes, serve_fake
from tests.support.servers import RunningServer, serve

TEXT = "Hello there. It has three sentences."


MakeTransport = Callable[..., Awaitable[SageMakerStreamTransport]]


async def collect(
    transport: SageMakerStreamTransport, text: str, into: bytearray | None = None
) -> bytes:
    received = bytearray() if into is None else into
    async for part in transport.synthesize(text, None, 1.0):
        assert isinstance(part, bytes)  # no timestamps asked: audio only
        received += part
    return bytes(received)


@pytest_asyncio.fixture(loop_scope="session")
async def make_transport(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[object]:
    clients = []

    async def make(
        emulator: RunningServer, endpoint: str = "kokoro-tts"
    ) -> SageMakerStreamTransport:
        # the AWS SDKs' endpoint override convention, as a deployment would set it
        monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", emulator.http_url)
        cm = aioboto3.Session().client(
            "sagemaker-runtime",
            region_name="us-east-1",
            config=Config(retries={"total_max_attempts": 1}),
        )
        clients.append(cm)
        return SageMakerStreamTransport(await cm.__aenter__(), endpoint)

    yield make
    for cm in clients:
        await cm.__aexit__(None, None, None)


@pytest.fixture
def stream_emulator(fake_server: RunningServer) -> Iterator[tuple[RunningServer, StreamScript]]:
    script = StreamScript(max_part=777)
    with serve(create_sagemaker_stream_emulator(fake_server.http_url, script)) as running:
        yield running, script


@pytest.mark.real_model
async def test_real_model_server_audio_arrives_byte_identical(
    model_server: RunningServer, make_transport: MakeTransport
) -> None:
    script = StreamScript(max_part=5000)
    with serve(create_sagemaker_stream_emulator(model_server.http_url, script)) as emulator:
        transport = await make_transport(emulator)
        pcm = await collect(transport, TEXT)
    async with httpx.AsyncClient(base_url=model_server.http_url, timeout=60) as http:
        direct = (await http.post("/invocations", json={"text": TEXT, "format": "pcm"})).content
    assert pcm == direct
    assert len(script.parts) > 5
    assert any(size % 2 for size in script.parts)  # parts cut samples in half


async def test_parts_are_reassembled(
    stream_emulator: tuple[RunningServer, StreamScript], make_transport: MakeTransport
) -> None:
    emulator, script = stream_emulator
    transport = await make_transport(emulator)
    pcm = await collect(transport, TEXT)
    assert len(pcm) == expected_pcm_bytes("Hello there.") + expected_pcm_bytes(
        "It has three sentences."
    )
    assert sum(script.parts) == len(pcm)
    assert len(script.parts) > 3


@pytest.mark.parametrize(
    ("field", "code"),
    [
        ("model_error_after", "tts_ModelStreamError"),
        ("internal_failure_after", "tts_InternalStreamFailure"),
    ],
)
async def test_stream_errors_become_tts_errors(
    stream_emulator: tuple[RunningServer, StreamScript],
    make_transport: MakeTransport,
    field: str,
    code: str,
) -> None:
    emulator, script = stream_emulator
    setattr(script, field, 2000)
    transport = await make_transport(emulator)
    received = bytearray()
    with pytest.raises(TTSError) as failure:
        await collect(transport, TEXT, received)
    assert failure.value.code == code
    assert failure.value.retryable is True
    assert 0 < len(received) <= 2000
    setattr(script, field, None)
    assert len(await collect(transport, TEXT)) > 2000  # the next request works


async def test_a_container_stream_cut_short_is_a_model_stream_error(
    make_transport: MakeTransport,
) -> None:
    """The model server cuts a stream whose synthesis failed after its headers (its second
    sentence here): the caller reads the first sentence's audio, then `ModelStreamError`,
    as SageMaker reports a container's broken answer; never a short answer that looks whole."""
    engine = FailingEngine(fails_on="three")
    with (
        serve_fake(engine) as server,
        serve(create_sagemaker_stream_emulator(server.http_url)) as emulator,
    ):
        transport = await make_transport(emulator)
        received = bytearray()
        with pytest.raises(TTSError) as failure:
            await collect(transport, TEXT, received)
    assert (failure.value.code, failure.value.retryable) == ("tts_ModelStreamError", True)
    assert failure.value.message == "SageMaker answered ModelStreamError"
    assert "stream broke off" in str(failure.value.detail)
    assert engine.calls == ["Hello there.", "It has three sentences."]
    assert len(received) == expected_pcm_bytes("Hello there.")


def assert_names_the_setting_for_the_log_only(failure: TTSError) -> None:
    """An unknown endpoint: the client reads the service's error code, the log (`detail`) the
    endpoint and the settings to check."""
    assert failure.message == f"SageMaker answered {failure.code.removeprefix('tts_')}"
    assert "Validation" in failure.code
    assert failure.detail is not None
    assert "'no-such-endpoint'" in failure.detail
    assert "GATEWAY_SAGEMAKER_ENDPOINT and GATEWAY_AWS_REGION" in failure.detail


async def test_unknown_endpoint_names_the_setting(
    stream_emulator: tuple[RunningServer, StreamScript], make_transport: MakeTransport
) -> None:
    emulator, _ = stream_emulator
    transport = await make_transport(emulator, "no-such-endpoint")
    with pytest.raises(TTSError) as failure:
        await collect(transport, TEXT)
    assert failure.value.retryable is False
    assert_names_the_setting_for_the_log_only(failure.value)


async def test_timestamps_come_back_as_the_captioned_answer(
    make_transport: MakeTransport, stream_emulator: tuple[RunningServer, StreamScript]
) -> None:
    """The batch path's word timings: the model server's JSON answer (stream false), carried in
    PayloadParts cut anywhere, read back as the words, then the same audio as without them."""
    emulator, script = stream_emulator
    transport = await make_transport(emulator)
    pieces = [p async for p in transport.synthesize(TEXT, None, 1.0, timestamps=True)]
    words = [w for p in pieces if isinstance(p, TimedWords) for w in p.words]
    pcm = b"".join(p for p in pieces if isinstance(p, bytes))
    assert isinstance(pieces[0], TimedWords)  # before the audio
    assert [w.word for w in words] == TEXT.split()
    assert len(pcm) == sum(
        expected_pcm_bytes(s) for s in ("Hello there.", "It has three sentences.")
    )
    assert orjson.loads(script.requests[-1])["timestamps"] is True
    # the fake engine: 10 ms per character, from each request's first sample
    assert (words[0].start, words[0].end) == (0.0, 0.05)
