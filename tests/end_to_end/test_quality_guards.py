"""Quality guards: what the speech sounds like cannot drift unseen. Judged offline by DistillMOS
and PocketSphinx (quality/judges.py) on the real Kokoro-82M; deterministic on the CPU, no
timing in any assertion.

- every lossy format, decoded as a listener's player would, within 0.15 MOS of the PCM of the
  same reply (the registry's bitrates and encoder settings are what is judged, on one engine
  call per segment: a model server with `--progressive off`, so the audio judged is the same
  from run to run; a progressive server's windows depend on the speed it measured, and the
  lossy formats of some layouts lose more: docs/measured.md);
- the gateway's chunked reply, paced like an LLM, on the default (progressive) model server,
  within 0.1 MOS of one batch of the same text in one call per segment (neither the chunk plan
  nor the windows can trade quality for latency unseen);
- the default voice's word error rate on the corpus, one engine call per segment, no worse
  than the stored baseline (`make bench-quality BENCH_ARGS=--write-baseline`; the stored one,
  0.230, is of one call per segment) plus `WER_MARGIN`: text normalisation, G2P, the segment
  split, the voice and the trim;
- the default model server (progressive, the streamed decoder) on the same corpus in the same
  run, no more than `STREAM_MARGIN` over one call per segment, and a reply asked while another
  runs beside it the same bytes as asked alone: its audio does not follow the machine's speed.
  The windows decoder's (`--decoder windows`, where torch is not installed) does, so its WER is
  `make bench-quality`'s alone; tests/model_server/test_progressive.py guards its level,
  spectrum, MOS and seams at a fixed speed.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from kokoro_contract.formats import FORMATS
from quality import corpus, judges
from quality.baseline import Baseline
from quality.wer import WordErrors, total, word_errors
from tests.support.gateway_client import sse_post
from tests.support.servers import RunningServer

pytestmark = pytest.mark.real_model

FORMAT_MOS_MARGIN = 0.10
PLAN_MOS_MARGIN = 0.10
# One call per segment reads the same from machine to machine (99 errors in 430 words, the
# stored baseline, on the machine that stored it and on a slower one, 2026-12-04), so four
# words (0.01) are the margin. The progressive path read 0.230 to 0.2605 over 2026-12-02/03
# and, on the slower machine, 0.293 and 0.302 where other runs of the same code passed under
# 0.280: its windows follow the speed the server measured, so no margin both passes it and
# still fails a real loss (the path before the norms' statistics were carried read 0.288).
WER_MARGIN = 0.01
# the streamed decoder against one call per segment, in one run: 95 and 93 of 430 words
# misheard (make bench-quality, 2026-12-06; the windows decoder 110 to 126), 89 in process
# with the generator's prior at the segment's length. Its audio does not depend on the
# machine's speed, so neither does this margin.
STREAM_MARGIN = 0.02
REPLY = corpus.load()[0]  # five sentences: a short first clause, a question at the end
LOSSY = sorted(name for name, f in FORMATS.items() if f.bit_rate)


async def batch(server: RunningServer, text: str) -> bytes:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=300) as http:
        response = await http.post("/invocations", json={"text": text, "format": "pcm"})
        response.raise_for_status()
        return response.content


class OneCall:
    """The one-call server's PCM of each text, voiced once in the module: one engine call per
    segment gives the same bytes every time, so `REPLY` (the corpus's first) serves both the
    formats' judge and the word error rate."""

    def __init__(self, server: RunningServer) -> None:
        self.server = server
        self._pcm: dict[str, bytes] = {}

    async def pcm(self, text: str) -> bytes:
        if text not in self._pcm:
            self._pcm[text] = await batch(self.server, text)
        return self._pcm[text]


@pytest.fixture(scope="module")
def one_call(one_call_model_server: RunningServer) -> OneCall:
    return OneCall(one_call_model_server)


@pytest.fixture(scope="module")
async def reply_pcm(one_call: OneCall) -> bytes:
    return await one_call.pcm(REPLY.text)


@pytest.mark.parametrize("name", LOSSY)
def test_each_format_within_010_mos_of_pcm(
    mos_judge: judges.MosJudge, reply_pcm: bytes, name: str
) -> None:
    reference = mos_judge.score(judges.decode(reply_pcm, "pcm"))
    decoded = judges.round_trip(reply_pcm, FORMATS[name])
    assert abs(len(decoded) / judges.JUDGE_RATE - len(reply_pcm) / 48_000) < 0.2
    score = mos_judge.score(decoded)
    assert score >= reference - FORMAT_MOS_MARGIN, (name, score, reference)


async def test_chunked_reply_within_01_mos_of_one_batch(
    mos_judge: judges.MosJudge, reply_pcm: bytes, gateway_server: RunningServer
) -> None:
    body = {"text": REPLY.text, "format": "pcm", "echo_tps": 40, "echo_first_ms": 300}
    reply = await sse_post(gateway_server.http_url, body)
    chunked = b"".join(reply.audio_chunks())
    metrics = reply.one("agent_end")["metrics"]
    assert metrics["chunks"] >= 2, metrics  # a chunked reply, or the guard guards nothing
    assert sum(metrics["chunk_audio_s"]) == pytest.approx(len(chunked) / 48_000, abs=0.005)
    one_batch = mos_judge.score(judges.decode(reply_pcm, "pcm"))
    score = mos_judge.score(judges.decode(chunked, "pcm"))
    assert score >= one_batch - PLAN_MOS_MARGIN, (score, one_batch, metrics["chunk_audio_s"])


@pytest.fixture(scope="module")
async def one_call_errors(one_call: OneCall, asr_judge: judges.AsrJudge) -> list[WordErrors]:
    """What the recogniser misses of each corpus reply, voiced one call per segment."""
    errors = []
    for reply in corpus.load():
        pcm = await one_call.pcm(reply.text)
        heard = asr_judge.transcribe(judges.decode(pcm, "pcm"))
        errors.append(word_errors(reply.spoken, heard))
    return errors


async def test_default_voice_word_error_rate_no_worse_than_baseline(
    one_call_model_server: RunningServer, one_call_errors: list[WordErrors]
) -> None:
    baseline = Baseline.read()
    async with httpx.AsyncClient(base_url=one_call_model_server.http_url) as http:
        default = (await http.get("/voices")).json()["default"]
    assert default == baseline.voice, "the baseline is for another voice: rerun bench-quality"
    measured = total(one_call_errors)
    assert measured.words == baseline.words  # the same corpus as the baseline's
    assert measured.rate <= baseline.rate + WER_MARGIN, (measured, baseline)


async def test_the_default_server_is_heard_as_one_call_and_the_same_when_busy(
    model_server: RunningServer, one_call_errors: list[WordErrors], asr_judge: judges.AsrJudge
) -> None:
    """The default model server's replies (progressive, the streamed decoder: windows that
    follow the speed the server measures) against one call per segment of the same text: the
    recogniser misses at most `STREAM_MARGIN` more of the corpus's words; and a reply asked
    again while another is synthesized beside it is the same bytes (the windows change when
    audio is computed, never its samples)."""
    async with httpx.AsyncClient(base_url=model_server.http_url) as http:
        load = (await http.get("/load")).json()
        engine = (await http.get("/ping")).json()["engine"]
    assert load["first_window_s"] is not None, load  # the path under guard is progressive
    assert "decoder stream" in engine, engine
    replies = corpus.load()
    streamed, alone = [], []
    for reply in replies:
        pcm = await batch(model_server, reply.text)
        heard = asr_judge.transcribe(judges.decode(pcm, "pcm"))
        streamed.append(word_errors(reply.spoken, heard))
        alone.append(pcm)
    # busy: the first two replies asked again at once, on the server's two workers, each
    # synthesized while the other is: both the same bytes as alone
    busy = await asyncio.gather(*(batch(model_server, reply.text) for reply in replies[:2]))
    for reply, pcm, again in zip(replies[:2], alone[:2], busy, strict=True):
        assert again == pcm, reply.text[:40]
    got, reference = total(streamed), total(one_call_errors)
    assert got.words == reference.words
    assert got.errors <= reference.errors + STREAM_MARGIN * got.words, (got, reference)


async def test_the_recogniser_hears_a_clip_the_same_whatever_came_before(
    model_server: RunningServer, asr_judge: judges.AsrJudge
) -> None:
    # a pair a decoder kept across clips heard differently the second time ("switch to a comp
    # of it", then "switch to a compliment")
    texts = ["Would you like me to switch your account today?", "The meeting moved to 2:15 PM."]
    first, other = [judges.decode(await batch(model_server, t), "pcm") for t in texts]
    heard = asr_judge.transcribe(first)
    assert heard  # it hears words at all
    asr_judge.transcribe(other)
    assert asr_judge.transcribe(first) == heard
