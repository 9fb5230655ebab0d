"""Codec checks for tests: the whole-unit rules an audio event must keep (MP3 frames, MP4 boxes)."""

from __future__ import annotations

from gateway.encoders.framing import mp4_box_at

# --- MP3 ----------------------------------------------------------------------------------------

_MP3_BITRATES = {  # kbit/s by bitrate index, for MPEG-1 and MPEG-2/2.5 layer III
    1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def mp3_frame_length(header: bytes) -> int | None:
    """Length of the layer III frame starting with these 4 bytes, or None if not a header."""
    if len(header) < 4 or header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
        return None
    version = (header[1] >> 3) & 0x3  # 3: MPEG-1, 2: MPEG-2, 0: MPEG-2.5
    layer = (header[1] >> 1) & 0x3
    bitrate_index = header[2] >> 4
    rate_index = (header[2] >> 2) & 0x3
    if version == 1 or layer != 1 or bitrate_index in (0, 15) or rate_index == 3:
        return None
    padding = (header[2] >> 1) & 0x1
    bitrate = _MP3_BITRATES[1 if version == 3 else 2][bitrate_index] * 1000
    rate = _MP3_RATES[version][rate_index]
    slots = 144 if version == 3 else 72
    return slots * bitrate // rate + padding


def split_mp3_frames(data: bytes) -> list[bytes]:
    """Split bytes that must be a whole number of MP3 frames; raises ValueError otherwise."""
    frames = []
    pos = 0
    while pos < len(data):
        length = mp3_frame_length(data[pos : pos + 4])
        if length is None or pos + length > len(data):
            raise ValueError(f"no whole MP3 frame at byte {pos} of {len(data)}")
        frames.append(data[pos : pos + length])
        pos += length
    return frames


def mp4_boxes(data: bytes) -> list[bytes]:
    """Top-level box types of whole-box data (for checks and tests)."""
    kinds = []
    pos = 0
    while pos < len(data):
        box = mp4_box_at(data, pos)
        if box is None or pos + box[1] > len(data):
            raise ValueError(f"cut MP4 box at byte {pos}")
        kinds.append(box[0])
        pos += box[1]
    return kinds
