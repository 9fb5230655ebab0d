"""Codec framing, pure: cut encoder output into whole units that a browser can append.

Every SSE event and WebSocket message carries whole units: whole MP3 frames; for fragmented
MP4 the init segment (ftyp+moov), then moof+mdat fragments; for WebM the header (EBML header,
Segment head, Info, Tracks), then whole Clusters. The splitters have the incremental-codec
shape `push(bytes) -> list[bytes]` / `flush() -> list[bytes]` and accept output cut anywhere.
"""

from __future__ import annotations

import struct

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


# --- fragmented MP4 -----------------------------------------------------------------------------


def _mp4_box(data: bytes, pos: int) -> tuple[bytes, int] | None:
    """(type, size) of the box at `pos`, or None until its whole header is there."""
    if len(data) - pos < 8:
        return None
    size, kind = struct.unpack_from(">I4s", data, pos)
    if size == 1:
        if len(data) - pos < 16:
            return None
        size = struct.unpack_from(">Q", data, pos + 8)[0]
    if size < 8:
        raise ValueError(f"bad MP4 box size {size} at byte {pos}")
    return kind, size


class Mp4FragmentSplitter:
    """ftyp+moov as one unit, then each [styp/sidx/prft+]moof+mdat as one; mfra is dropped."""

    def __init__(self) -> None:
        self._buf = b""
        self._group_end = 0  # boxes in buf[:group_end] belong to the unit being collected

    def push(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while (box := _mp4_box(self._buf, self._group_end)) is not None:
            kind, size = box
            end = self._group_end + size
            if end > len(self._buf):
                break
            if kind == b"mfra":  # random-access index for files; nothing to play
                self._buf = self._buf[: self._group_end] + self._buf[end:]
                continue
            self._group_end = end
            if kind in (b"moov", b"mdat"):
                out.append(self._buf[:end])
                self._buf = self._buf[end:]
                self._group_end = 0
        return out

    def flush(self) -> list[bytes]:
        rest, self._buf, self._group_end = self._buf, b"", 0
        if rest:
            raise ValueError(f"{len(rest)} bytes of an unfinished MP4 fragment")
        return []


def mp4_boxes(data: bytes) -> list[bytes]:
    """Top-level box types of whole-box data (for checks and tests)."""
    kinds = []
    pos = 0
    while pos < len(data):
        box = _mp4_box(data, pos)
        if box is None or pos + box[1] > len(data):
            raise ValueError(f"cut MP4 box at byte {pos}")
        kinds.append(box[0])
        pos += box[1]
    return kinds


# --- WebM ---------------------------------------------------------------------------------------

EBML_HEADER = 0x1A45DFA3
SEGMENT = 0x18538067
CLUSTER = 0x1F43B675
_UNKNOWN = -1


def _vint(data: bytes, pos: int, keep_marker: bool) -> tuple[int, int] | None:
    """(value, length) of the EBML variable-length integer at `pos`, or None if cut."""
    if pos >= len(data):
        return None
    first = data[pos]
    if first == 0:
        raise ValueError(f"bad EBML vint at byte {pos}")
    length = 8 - first.bit_length() + 1
    if pos + length > len(data):
        return None
    value = int.from_bytes(data[pos : pos + length], "big")
    if keep_marker:
        return value, length
    value &= (1 << (7 * length)) - 1
    if value == (1 << (7 * length)) - 1:
        value = _UNKNOWN
    return value, length


def _ebml_element(data: bytes, pos: int) -> tuple[int, int, int] | None:
    """(id, header length, payload size or -1) of the element at `pos`, or None if cut."""
    ident = _vint(data, pos, keep_marker=True)
    if ident is None:
        return None
    size = _vint(data, pos + ident[1], keep_marker=False)
    if size is None:
        return None
    return ident[0], ident[1] + size[1], size[0]


class WebmClusterSplitter:
    """The header up to the first Cluster as one unit, then each Cluster as one.

    The live muxer writes the Segment with an unknown size and each Cluster with a known one."""

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0  # parse position inside buf
        self._in_segment = False

    def push(self, data: bytes) -> list[bytes]:
        self._buf += data
        out: list[bytes] = []
        while (element := _ebml_element(self._buf, self._pos)) is not None:
            ident, header, size = element
            if ident == SEGMENT and not self._in_segment:
                self._in_segment = True  # descend: its children are the units
                self._pos += header
                continue
            if ident == CLUSTER:
                if size == _UNKNOWN:
                    raise ValueError("WebM cluster of unknown size: use the live muxer")
                if self._pos:  # the header before the first cluster
                    out.append(self._buf[: self._pos])
                    self._buf, self._pos = self._buf[self._pos :], 0
                    continue
                if header + size > len(self._buf):
                    break
                out.append(self._buf[: header + size])
                self._buf = self._buf[header + size :]
                continue
            if size == _UNKNOWN:
                raise ValueError(f"EBML element {ident:#x} of unknown size")
            if self._pos + header + size > len(self._buf):
                break
            self._pos += header + size
        return out

    def flush(self) -> list[bytes]:
        rest, self._buf, self._pos = self._buf, b"", 0
        return [rest] if rest else []  # trailing Cues, if the muxer wrote any
