"""How close one rendering of a sentence is to another of the same length, pure: the level of
each 25 ms frame and the spectrum of 25 ms Hann frames, in dB (a stream against its one call,
a blend against a pack mixed by hand), and DistillMOS of float audio as the server sends it."""

from __future__ import annotations

import numpy as np

from quality import judges

FRAME = 600  # 25 ms at 24 kHz


def frames_db(audio: np.ndarray) -> np.ndarray:
    """Each 25 ms frame's RMS level, dB."""
    frames = audio[: audio.size // FRAME * FRAME].reshape(-1, FRAME).astype(np.float64)
    return 20 * np.log10(np.sqrt(np.mean(frames**2, axis=1)) + 1e-5)


def spectrum_db(audio: np.ndarray) -> np.ndarray:
    """Magnitudes in dB of 25 ms Hann frames, hop 12.5 ms."""
    starts = range(0, audio.size - FRAME + 1, FRAME // 2)
    frames = np.stack([audio[s : s + FRAME] for s in starts]) * np.hanning(FRAME)
    magnitude: np.ndarray = 20 * np.log10(np.abs(np.fft.rfft(frames, axis=1)) + 1e-4)
    return magnitude


def envelope_db(audio: np.ndarray, reference: np.ndarray) -> float:
    """The mean level difference, frame by frame, where the reference speaks (within 30 dB
    of its loudest frame)."""
    level = frames_db(reference)
    loud = level > level.max() - 30
    return float(np.abs(frames_db(audio) - level)[loud].mean())


def spectrum_difference_db(audio: np.ndarray, reference: np.ndarray) -> float:
    """The mean spectral difference over the bins within 60 dB of the reference's loudest."""
    wanted = spectrum_db(reference)
    heard = wanted > wanted.max() - 60
    return float(np.abs(spectrum_db(audio) - wanted)[heard].mean())


def mos(judge: judges.MosJudge, audio: np.ndarray) -> float:
    """DistillMOS of float audio at 24 kHz, as 16-bit PCM (what the server sends)."""
    pcm = (np.clip(audio, -1, 1) * 32767).round().astype("<i2").tobytes()
    return judge.score(judges.decode(pcm, "pcm"))
