"""The model server's JSON batch answer (`stream: false, timestamps: true`), pure: base64 PCM
beside its word timings, as pieces of a stream (the timings first, then the audio)."""

from __future__ import annotations

import base64
import binascii

import orjson

from gateway.errors import TTSError
from gateway.transports.base import Piece, TimedWords
from kokoro_contract.protocol import parse_words

PIECE_BYTES = 48_000  # one second of PCM per piece


def captioned_pieces(body: bytes) -> list[Piece]:
    try:
        answer = orjson.loads(body)
        pcm = base64.b64decode(answer["audio"], validate=True)
    except (orjson.JSONDecodeError, KeyError, TypeError, binascii.Error) as exc:
        raise TTSError(f"model server sent an unreadable captioned answer: {exc}") from exc
    pieces: list[Piece] = [TimedWords(parse_words(answer.get("words")))]
    pieces += [pcm[i : i + PIECE_BYTES] for i in range(0, len(pcm), PIECE_BYTES)]
    return pieces
