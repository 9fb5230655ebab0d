"""Kokoro voice plugin for LiveKit Agents: the Kokoro voice gateway as a streaming TTS, text
in as the LLM writes it, 24 kHz PCM and word-aligned transcripts out.

See integrations/livekit/README.md in the repository.
"""

from livekit.agents import Plugin

from .log import logger
from .tts import TTS, ChunkedStream, SynthesizeStream
from .version import __version__

__all__ = ["TTS", "ChunkedStream", "SynthesizeStream", "__version__"]


class KokoroVoicePlugin(Plugin):
    def __init__(self) -> None:
        super().__init__(__name__, __version__, __package__, logger)


Plugin.register_plugin(KokoroVoicePlugin())
