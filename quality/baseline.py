"""The default voice's word error rate on the corpus, as `make bench-quality --write-baseline`
last measured it: the quality guard allows no more than this plus a small margin."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

BASELINE_PATH = Path(__file__).with_name("baseline.json")


@dataclass(frozen=True)
class Baseline:
    voice: str
    errors: int
    words: int

    @property
    def rate(self) -> float:
        return self.errors / self.words

    def write(self, path: Path = BASELINE_PATH) -> None:
        path.write_bytes(orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2) + b"\n")

    @classmethod
    def read(cls, path: Path = BASELINE_PATH) -> Baseline:
        data = orjson.loads(path.read_bytes())
        return cls(str(data["voice"]), int(data["errors"]), int(data["words"]))
