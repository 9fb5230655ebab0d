"""The model server's runtime state: the engine loads in the background while /ping says 503."""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kokoro_contract.errors import NotReady
from kokoro_contract.protocol import RequestRules, SynthesisRequest, new_request_id
from model_server.config import Settings
from model_server.engines.base import Engine, ProgressiveEngine
from model_server.engines.registry import engine_kind
from model_server.scheduler import Scheduler
from model_server.synthesis import Synthesizer
from model_server.text.g2p import G2P, default_g2p

log = logging.getLogger(__name__)

EngineFactory = Callable[[Settings], Engine]


def default_engine_factory(settings: Settings) -> Engine:
    """The engine `settings.engine` names (`engines.registry`); its heavy imports happen
    here, off the event loop."""
    return engine_kind(settings.engine).load(settings)


# The registry's packs are Japanese voices; of them, jm_kumo reads English the most
# intelligibly (the lowest corpus word error rate) and also scores the highest DistillMOS, so it
# is the default where no voice is configured and no English pack is there (make bench-quality:
# docs/measured.md, "Speech quality (`make bench-quality`)").
FALLBACK_VOICE = "jm_kumo"

# work done ahead (a voice's priors) takes a worker's cores only after this long with no
# engine call, and looks again this often
QUIET_S = 1.0
LOOK_S = 0.05
STOP_WAIT_S = 10.0  # at shutdown, for the step under way (one whole call)


def preferred_voice(voices: frozenset[str]) -> str:
    """The default when none is configured: af_heart, else another English pack (Kokoro names
    them a*/b* for American and British English), else the registry's pack that reads English
    most intelligibly."""
    if "af_heart" in voices:
        return "af_heart"
    english = sorted(v for v in voices if v[:1] in ("a", "b") and v[2:3] == "_")
    return english[0] if english else FALLBACK_VOICE


@dataclass
class Loaded:
    synthesizer: Synthesizer
    rules: RequestRules
    load_s: float


class ModelService:
    def __init__(
        self,
        settings: Settings,
        engine_factory: EngineFactory = default_engine_factory,
        g2p_factory: Callable[[], G2P] = default_g2p,
    ) -> None:
        self.settings = settings
        self._engine_factory = engine_factory
        self._g2p_factory = g2p_factory
        self._loaded: Loaded | None = None
        self.failure: str | None = None
        self.settled = threading.Event()  # loaded or failed; for embedding and tests
        # every voice's priors made, or their preparation ended (off, stopped, failed)
        self.prepared = threading.Event()
        self._stop = threading.Event()  # the server stops: work done ahead stops too
        self._preparing: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return self._loaded is not None

    def get(self) -> Loaded:
        if self._loaded is None:
            raise NotReady(self.failure or "the model is still loading; retry shortly")
        return self._loaded

    async def load(self) -> None:
        """Load the engine and G2P off the event loop, warm up, then report ready."""
        started = time.perf_counter()
        try:
            engine, g2p = await asyncio.to_thread(
                lambda: (self._engine_factory(self.settings), self._g2p_factory())
            )
            voices = frozenset(engine.voices())
            default_voice = self.settings.default_voice or preferred_voice(voices)
            if default_voice not in voices:
                raise ValueError(
                    f"default voice {default_voice!r} is not loaded "
                    f"(loaded: {', '.join(sorted(voices))})"
                )
            rules = RequestRules(
                voices=voices,
                default_voice=default_voice,
                max_text_chars=self.settings.max_text_chars,
            )
            scheduler = Scheduler(self.settings.workers, self.settings.scheduling)
            synthesizer = Synthesizer(
                engine,
                g2p,
                scheduler,
                progressive=self.settings.progressive,
                max_pause_s=self.settings.max_pause_s,
            )
            if self.settings.warmup:
                # the first call pays for what an engine sets up once; the second is one like
                # any other, and the speed learned starts from it
                for first in (True, False):
                    warm = SynthesisRequest(
                        "Hello there.", rules.default_voice, 1.0, new_request_id()
                    )
                    async for _ in synthesizer.stream(warm, key="warmup"):
                        pass
                    if first:
                        scheduler.forget_speed()
        except Exception as exc:
            self.failure = f"model failed to load: {exc}"
            log.error("%s", self.failure)
            self.settled.set()
            self.prepared.set()
            raise
        self._loaded = Loaded(synthesizer, rules, time.perf_counter() - started)
        self.settled.set()
        note = engine.voice_note  # the onnx engine's: English voices or why not
        log.info(
            "ready: engine %s, g2p %s, voice %s, %d workers, loaded in %.1f s%s",
            engine.description,
            g2p.name,
            default_voice,
            self.settings.workers,
            self._loaded.load_s,
            f"; {note}" if note else "",
        )
        if self.settings.prepare_voices and synthesizer.progressive is not None:
            order = sorted(voices, key=lambda v: (v != default_voice, v))
            self._preparing = threading.Thread(
                target=self._prepare,
                args=(synthesizer.progressive, order, scheduler),
                name="prepare-voices",
                daemon=True,
            )
            self._preparing.start()
        else:
            self.prepared.set()

    def _prepare(self, engine: ProgressiveEngine, voices: list[str], scheduler: Scheduler) -> None:
        """Each voice's priors made ahead of its first request (`ProgressiveEngine.
        prepare_voice`), one voice after another in this thread of its own, each step once no
        engine call has run or waited for `QUIET_S` (or at once while a request waits for
        it); stopped with the server (`close`)."""
        stop = self._stop

        def pause(wanted: Callable[[], bool]) -> None:
            while not (wanted() or scheduler.quiet_s() >= QUIET_S) and not stop.wait(LOOK_S):
                pass
            if stop.is_set():
                raise _Stopped

        started, done, queue = time.perf_counter(), 0, collections.deque(voices)
        try:
            while queue:
                voice = queue.popleft()
                try:
                    if not engine.prepare_voice(voice, pause):
                        queue.append(voice)  # it gave way to a request: later
                        continue
                    done += 1
                except _Stopped:
                    return
                except Exception as exc:  # the voice still works: its first request makes it
                    log.warning("could not prepare the voice %s ahead: %s", voice, exc)
            log.info(
                "voices prepared: %d of %d in %.1f s",
                done,
                len(voices),
                time.perf_counter() - started,
            )
        finally:
            self.prepared.set()

    def close(self) -> None:
        self._stop.set()
        if self._preparing is not None:  # its step ends before the engine's threads do
            self._preparing.join(timeout=STOP_WAIT_S)
        if self._loaded is not None:
            self._loaded.synthesizer.close()


class _Stopped(Exception):
    """Work done ahead stops: the server does."""
