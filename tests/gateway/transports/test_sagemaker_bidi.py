"""SageMaker bidirectional streaming through the real HTTP/2 SDK (its serialization, event
signing and deserialization), bridged through its transport seam to the model server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio

from emulators.credentials import CredentialsScript, Issued, create_credentials_emulator
from emulators.sagemaker_bidi import BidiScript, SeamTransport
from gateway.errors import TTSError
from gateway.transports.base import TimedWords
from gateway.transports.sagemaker_bidi import SageMakerBidiTransport
from tests.gateway.transports.test_sagemaker_stream import assert_names_the_setting_for_the_log_only
from tests.support.fakes import expected_pcm_bytes
from tests.support.servers import RunningServer, serve

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
    with pytest.raises(TTSError) as failure:
        await speak(transport, ["Hello there."])
    await transport.close()
    assert_names_the_setting_for_the_log_only(failure.value)


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


# --- credentials on AWS compute: botocore's chain, no key in the environment ----------------

SOON = Issued("ASIASOONSTALE", "stale-secret", "stale-token", expires_in_s=300)  # refresh due
FRESH = Issued("ASIAFRESHKEY", "fresh-secret", "fresh-token", expires_in_s=3600)


@pytest.fixture
def no_static_keys(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An AWS host's environment: no keys, no profile files, no instance metadata here."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


async def speak_signed(fake_server: RunningServer) -> tuple[bytes, list[Any]]:
    """Two replies through the real SDK; what reached the container and the signed requests."""
    seam = SeamTransport(fake_server.ws_url + BIDI, BidiScript())
    transport = SageMakerBidiTransport("kokoro-tts", "us-east-1", http_transport=seam)
    try:
        pcm = await speak(transport, ["Hello there."]) + await speak(transport, ["Again."])
    finally:
        await transport.close()
    assert seam.script.streams == 2
    return pcm, seam.requests


def signed_with(request: Any) -> tuple[str, str]:
    """(access key id, session token) a request was signed with."""
    auth = request.fields["authorization"].values[0]
    key = auth.removeprefix("AWS4-HMAC-SHA256 Credential=").split("/")[0]
    return key, request.fields["x-amz-security-token"].values[0]


async def test_container_credentials_sign_the_stream(
    no_static_keys: None, fake_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ECS/Fargate and EKS Pod Identity: the credentials endpoint; a credential close to its
    expiry is refreshed before it signs anything."""
    script = CredentialsScript([SOON, FRESH])
    with serve(create_credentials_emulator(script)) as creds:
        monkeypatch.setenv("AWS_CONTAINER_CREDENTIALS_FULL_URI", creds.http_url + "/credentials")
        monkeypatch.setenv("AWS_CONTAINER_AUTHORIZATION_TOKEN", "pod-identity-token")
        pcm, requests = await speak_signed(fake_server)
    assert len(pcm) == expected_pcm_bytes("Hello there.") + expected_pcm_bytes("Again.")
    assert [signed_with(r) for r in requests] == [("ASIAFRESHKEY", "fresh-token")] * 2
    assert script.fetches == [{"authorization": "pod-identity-token"}] * 2  # load, refresh


async def test_web_identity_credentials_sign_the_stream(
    no_static_keys: None,
    fake_server: RunningServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """EKS IRSA: a projected token file exchanged with STS for the role's credentials."""
    token = tmp_path / "token"
    token.write_text("eyJ.web-identity.token")
    role = "arn:aws:iam::123456789012:role/kokoro-gateway"
    script = CredentialsScript([FRESH])
    with serve(create_credentials_emulator(script)) as sts:
        monkeypatch.setenv("AWS_ENDPOINT_URL_STS", sts.http_url)
        monkeypatch.setenv("AWS_ROLE_ARN", role)
        monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(token))
        monkeypatch.setenv("AWS_REGION", "us-east-1")
        pcm, requests = await speak_signed(fake_server)
    assert len(pcm) > 0
    assert [signed_with(r) for r in requests] == [("ASIAFRESHKEY", "fresh-token")] * 2
    (fetch,) = script.fetches  # one exchange: the credential is good for an hour
    assert fetch["Action"] == "AssumeRoleWithWebIdentity"
    assert (fetch["RoleArn"], fetch["WebIdentityToken"]) == (role, "eyJ.web-identity.token")
