"""A streamed engine's segments decoded through a `Batcher` (`--batch on`), for the engines'
tests: their first steps held until all are queued, so that they run as one batch."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from model_server.batching import Policy
from model_server.engines.base import CancelToken
from model_server.engines.batcher import Batcher
from model_server.errors import SynthesisCancelled
from model_server.windows import Window


def batched_decodes(
    engine: Any, voice: str, texts: list[str], cancelled: int | None = None
) -> tuple[list[np.ndarray | None], dict[int, int]]:
    """Each text's segment (in `voice`) decoded whole on its own thread through a `Batcher`
    put in the engine's place, its first steps held until all are queued (so they run as one
    batch of them all); the one at `cancelled` cancelled while queued. Each thread's audio (None: it
    was cancelled) and the batches run by size."""
    streamed = engine._streamed
    assert streamed is not None
    # as many threads as the engine's own runner: oneDNN's sums follow the thread count
    threads = streamed.thread.run(torch.get_num_threads)
    batcher = Batcher(threads, Policy(window_s=0.004, max_size=len(texts)))
    before, streamed.thread = streamed.thread, batcher
    try:
        fronts = [engine.front(t, voice, 1.0, CancelToken()) for t in texts]
        tokens = [CancelToken() for _ in texts]
        audio: list[np.ndarray | None] = [None] * len(texts)
        hold = threading.Event()
        holding = threading.Thread(target=batcher.run, args=(hold.wait,))
        holding.start()

        def decode(i: int) -> None:
            try:
                audio[i] = engine.decode(fronts[i], Window(0, fronts[i].frames, 0, 0), tokens[i])
            except SynthesisCancelled:
                audio[i] = None

        threads = [threading.Thread(target=decode, args=(i,)) for i in range(len(texts))]
        for t in threads:
            t.start()
        with batcher._cond:  # every first step queued behind the held thread
            assert batcher._cond.wait_for(lambda: len(batcher._due) == len(texts), timeout=120)
        if cancelled is not None:
            tokens[cancelled].cancel()
        hold.set()
        for t in threads:
            t.join()
        holding.join()
        return audio, dict(batcher.curve.batches)
    finally:
        streamed.thread = before
        batcher.close()
