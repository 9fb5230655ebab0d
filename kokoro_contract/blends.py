"""Voice blends, pure, for both sides: `af_bella(2)+af_sky(1)` (or the same as a list of
parts) is one voice whose style is the packs' mixed with normalised weights. The gateway checks
a blend against the model servers' voices and saves named ones; the model server mixes the
packs. A blend's canonical name (`Blend.name`: parts by name, weights normalised) keys it
everywhere, so "af_sky+af_bella" and "af_bella(1)+af_sky(1)" are one voice."""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from kokoro_contract.errors import InvalidRequest

MAX_PARTS = 4
MAX_WEIGHT = 100.0
_PART = re.compile(r"\s*([A-Za-z0-9_.-]{1,64})\s*(?:\(\s*([0-9]*\.?[0-9]+)\s*\))?\s*")


@dataclass(frozen=True)
class Blend:
    """Its voices, by name, each with its weight relative to the lightest's (which is 1)."""

    parts: tuple[tuple[str, float], ...]

    @property
    def name(self) -> str:
        """The canonical spelling: "af_bella(2)+af_sky(1)" (read back, the same blend)."""
        return "+".join(f"{voice}({weight:.6g})" for voice, weight in self.parts)

    @property
    def shares(self) -> tuple[tuple[str, float], ...]:
        """Each voice's share of the mix: the weights normalised to sum to 1."""
        total = sum(weight for _, weight in self.parts)
        return tuple((voice, weight / total) for voice, weight in self.parts)


def is_blend(voice: object) -> TypeGuard[str | Sequence[object]]:
    """Whether a request's `voice` asks for a blend (a list of parts, or a name with "+" or a
    weight in brackets) rather than one voice."""
    return isinstance(voice, list) or (isinstance(voice, str) and ("+" in voice or "(" in voice))


def parse_blend(voice: str | Sequence[object]) -> Blend:
    """The blend `voice` spells: parts joined by "+" (or given as a list), each a voice name
    with an optional positive weight in brackets (1 without). `invalid_voice` when it does not
    parse, names a voice twice, has more than `MAX_PARTS` parts or a weight that is not a
    positive number up to `MAX_WEIGHT`."""
    if isinstance(voice, str):
        pieces = voice.split("+")
    else:
        if not voice or not all(isinstance(part, str) for part in voice):
            raise _invalid("a blend given as a list is a list of voice names")
        pieces = [str(part) for part in voice]
    if len(pieces) > MAX_PARTS:
        raise _invalid(f"a blend has at most {MAX_PARTS} voices")
    weights: dict[str, float] = {}
    for piece in pieces:
        match = _PART.fullmatch(piece)
        if match is None:
            raise _invalid(f"{piece.strip()[:40]!r} is not a voice with an optional (weight)")
        name, weight = match[1], float(match[2]) if match[2] is not None else 1.0
        if name in weights:
            raise _invalid(f"{name} is named twice")
        if not (math.isfinite(weight) and 0 < weight <= MAX_WEIGHT):
            raise _invalid(f"{name}'s weight must be above 0 and at most {MAX_WEIGHT:g}")
        weights[name] = weight
    lightest = min(weights.values())
    return Blend(
        tuple((name, float(f"{weights[name] / lightest:.6g}")) for name in sorted(weights))
    )


def check_blend(voice: str | Sequence[object], voices: Collection[str]) -> str:
    """A blend's canonical name, each part a loaded voice (`unknown_voice` naming the first
    that is not); a blend of one voice is that voice."""
    blend = parse_blend(voice)
    for name, _ in blend.parts:
        if name not in voices:
            known = ", ".join(sorted(voices))
            raise InvalidRequest(
                f"unknown voice {name!r} in the blend; loaded voices: {known}",
                code="unknown_voice",
            )
    return blend.parts[0][0] if len(blend.parts) == 1 else blend.name


def _invalid(why: str) -> InvalidRequest:
    return InvalidRequest(
        f"field 'voice': {why} (a blend: 'af_bella(2)+af_sky(1)')", code="invalid_voice"
    )
