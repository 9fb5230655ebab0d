"""The corpus in `corpus.txt`: replies of sentences, each with what a listener should hear."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CORPUS_PATH = Path(__file__).with_name("corpus.txt")


@dataclass(frozen=True)
class Sentence:
    text: str  # as an LLM writes it
    spoken: str  # what a listener should hear: the reference for the word error rate


@dataclass(frozen=True)
class Reply:
    sentences: tuple[Sentence, ...]

    @property
    def text(self) -> str:
        return " ".join(s.text for s in self.sentences)

    @property
    def spoken(self) -> str:
        return " ".join(s.spoken for s in self.sentences)


def parse(source: str) -> list[Reply]:
    """Replies separated by blank lines; `text | spoken` per line; `#` starts a comment line."""
    replies: list[Reply] = []
    current: list[Sentence] = []
    for number, line in enumerate(source.splitlines(), 1):
        line = line.strip()
        if line.startswith("#"):
            continue
        if not line:
            if current:
                replies.append(Reply(tuple(current)))
                current = []
            continue
        text, bar, spoken = line.partition(" | ")
        if not bar or not text.strip() or not spoken.strip():
            raise ValueError(f"corpus line {number}: expected 'text | spoken', got {line!r}")
        current.append(Sentence(text.strip(), spoken.strip()))
    if current:
        replies.append(Reply(tuple(current)))
    return replies


def load(path: Path = CORPUS_PATH) -> list[Reply]:
    return parse(path.read_text(encoding="utf-8"))


def sentences(replies: list[Reply]) -> list[Sentence]:
    return [s for reply in replies for s in reply.sentences]
