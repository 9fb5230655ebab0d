"""Codec framing, pure: cut encoder output into whole units that a browser can append.

Every SSE event and WebSocket message carries whole units: whole MP3 frames (the bare encoder's
packets are frames already); for fragmented MP4 the init segment (ftyp+moov), then moof+mdat
fragments; for WebM the header (EBML header, Segment head, Info, Tracks), then whole Clusters.
The splitters have the incremental-codec shape `push(bytes) -> list[bytes]` /
`flush() -> list[bytes]` and accept output cut anywhere.
"""

from __future__ import annotations

import struct

# --- fragmented MP4 -----------------------------------------------------------------------------


def mp4_box_at(data: bytes, pos: int) -> tuple[bytes, int] | None:
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
        while (box := mp4_box_at(self._buf, self._group_end)) is not None:
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
