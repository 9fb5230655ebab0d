"""Japanese text, end to end: the gateway cuts it at its own sentence marks (`。`, no space
after them) and the model server voices it through the Japanese G2P (`ScriptG2P`), so a
Japanese voice speaks it as Japanese, heard as well as it speaks English."""

from __future__ import annotations

import pytest

from quality import judges
from tests.support.gateway_client import sse_post
from tests.support.servers import RunningServer

pytestmark = pytest.mark.real_model

FIRST = "かしこまりました。"
SECOND = "ご注文の品は昨日、ポートランドの倉庫から発送されました。"
# jf_alpha's DistillMOS over six Japanese agent sentences was 4.57, over the English corpus 4.58
# (docs/measured.md, 2026-12-07 early morning); read by the English G2P, kana and kanji are not
# Japanese speech at all
MOS_FLOOR = 4.2


async def test_japanese_is_cut_at_its_sentence_marks_and_spoken_as_japanese(
    gateway_server: RunningServer, mos_judge: judges.MosJudge
) -> None:
    body = {"text": FIRST + SECOND, "voice": "jf_alpha", "format": "pcm", "timestamps": True}
    reply = await sse_post(gateway_server.http_url, body)
    assert "error" not in reply.names
    metrics = reply.one("agent_end")["metrics"]
    # the first a sentence, cut at 。; the second whole, or cut after its 、 when the plan
    # finds it too long for its deadline on this machine
    assert metrics["chunk_chars"][0] == len(FIRST)
    assert metrics["chunk_chars"][1:] in ([len(SECOND)], [9, len(SECOND) - 9])
    pcm = b"".join(reply.audio_chunks())
    assert sum(metrics["chunk_audio_s"]) == pytest.approx(len(pcm) / 48_000, abs=0.005)
    # 37 characters at 0.156-0.169 s each, as the measured sentences spoke
    assert 4.0 <= len(pcm) / 48_000 <= 8.5
    assert mos_judge.score(judges.decode(pcm, "pcm")) >= MOS_FLOOR
    # timed on the written text word by word (the Japanese reader's words: no spaces), in
    # order, each sentence's in its chunk; punctuation is no word
    words = [w for body in reply.data("words") for w in body["words"]]
    assert "".join(w["word"] for w in words) == (FIRST + SECOND).replace("。", "").replace("、", "")
    assert words[0]["word"] == "かしこまり"  # the reader's first word, not the sentence
    first_chunk_ms = metrics["chunk_audio_s"][0] * 1000
    cut = next(i for i, w in enumerate(words) if w["start_ms"] >= first_chunk_ms)
    assert "".join(w["word"] for w in words[:cut]) == FIRST.removesuffix("。")
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts)
