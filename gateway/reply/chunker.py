"""Incremental sentence chunking of streamed LLM text, pure: no I/O, no asyncio.

`push(text)` returns the chunks that became final, `flush()` the rest. Every decision is made
from the text seen so far, only once the characters after a candidate boundary show what it is
(a period followed by a space and a capital is a sentence end; one followed by a digit, a letter
or a lower-case word is not), so the chunks never depend on how the text was split into pushes.

- Sentences end at `.` `!` `?` `…` (with closing quotes or brackets) or a newline; never inside
  abbreviations (Dr., e.g., U.S. before a lower-case word), initials (J. R. R.), decimals
  (3.14, $29.99), times, version numbers, URLs or e-mail addresses.
- The first chunk is released early: at the first clause mark (`,` `;` `:` or a dash) once it
  has `first_min_words` words, or after `first_max_words` words without punctuation. With
  `first_wait_words`, past `first_max_words` it is cut only where a phrase begins (before a
  conjunction or preposition: "Sure, I can help you | with that right away."), at a clause
  mark or at the sentence end, and at `first_wait_words` before the last phrase start seen
  (or between words, if there was none): never "that right | away.".
- Later chunks merge sentences shorter than `merge_below_chars` with the next, and are cut at a
  clause mark past `soft_max_chars` or between words at `max_chars`, well under Kokoro's
  510-phoneme limit.
- Japanese and Chinese text, which has no spaces, ends its sentences at `。！？` and its clauses
  at `、，；：` (and their full-width and half-width forms), with no space needed after them;
  its lengths count each CJK character as 2.5 letters of English (`spoken_len`), so the same
  limits hold about as much speech. Where it has no mark at all it is cut at `max_chars`.
- Hindi ends its sentences at `।` (and `॥`), followed by a space as English's are.
- Speech markup (`kokoro_contract.markup`) is never cut inside: a pronunciation
  `[word](/IPA/)`, a `[pause:1s]`, and in a text that starts with `<speak>` a tag, an entity or
  an inline element (`<sub>`, `<phoneme>`, `<say-as>`) with its words. One still arriving holds
  the text from where it begins (`markup.HOLD_CHARS` at most: then it is text).
"""

from __future__ import annotations

from dataclasses import dataclass

from kokoro_contract import markup
from kokoro_contract.scripts import CJK_CHAR_WEIGHT, is_cjk

TERMINALS = ".!?…।॥"  # with Hindi's danda and double danda
CLOSERS = "\"')]}»”’"
CLAUSE_MARKS = ",;:—–"
# Japanese and Chinese (and their full-width forms): sentences and clauses end with no space
# after them, and the text has no spaces between words
CJK_TERMINALS = "。！？｡"
CJK_CLOSERS = "」』）】〉》〕"
CJK_CLAUSE_MARKS = "、，；：､"
# an English word, with its space, is about five characters
WORD_CHARS = 5
# Never end a sentence, whatever follows.
TITLES = frozenset(
    {
        "mr",
        "mrs",
        "ms",
        "dr",
        "prof",
        "sr",
        "jr",
        "st",
        "mt",
        "vs",
        "cf",
        "fig",
        "no",
        "vol",
        "approx",
        "capt",
        "col",
        "gen",
        "lt",
        "sgt",
        "rep",
        "sen",
        "gov",
        "e.g",
        "i.e",
    }
)


# Words that begin a phrase: cutting before one keeps the phrase whole.
PHRASE_STARTS = frozenset(
    {
        "and",
        "but",
        "or",
        "so",
        "yet",
        "because",
        "while",
        "when",
        "whenever",
        "if",
        "unless",
        "although",
        "though",
        "since",
        "until",
        "which",
        "who",
        "where",
        "with",
        "within",
        "without",
        "from",
        "to",
        "for",
        "in",
        "on",
        "at",
        "of",
        "by",
        "about",
        "after",
        "before",
        "into",
        "over",
        "under",
        "through",
        "during",
        "between",
    }
)


@dataclass(frozen=True)
class ChunkerConfig:
    first_min_words: int = 4
    first_max_words: int = 8
    first_wait_words: int | None = None  # None: cut at first_max_words wherever it falls
    merge_below_chars: int = 40
    soft_max_chars: int = 200
    max_chars: int = 300

    def __post_init__(self) -> None:
        if not 0 < self.first_min_words <= self.first_max_words:
            raise ValueError("need 0 < first_min_words <= first_max_words")
        if self.first_wait_words is not None and self.first_wait_words < self.first_max_words:
            raise ValueError("need first_max_words <= first_wait_words")
        if not 0 < self.soft_max_chars <= self.max_chars:
            raise ValueError("need 0 < soft_max_chars <= max_chars")


_NEED_MORE = -1
_NO = -2


class IncrementalSentenceChunker:
    def __init__(self, config: ChunkerConfig | None = None) -> None:
        self.config = config or ChunkerConfig()
        self._buf = ""
        self._scan = 0  # every position before this one has been decided: no cut
        self.chunks_emitted = 0
        self._ssml: bool | None = None  # whether the text is an SSML document, once known

    def push(self, text: str) -> list[str]:
        self._buf += text
        out: list[str] = []
        while True:
            cut = self._next_cut()
            if cut is None:
                return out
            chunk, self._buf = self._buf[:cut].strip(), self._buf[cut:]
            self._scan = 0
            if chunk:
                out.append(chunk)
                self.chunks_emitted += 1

    def flush(self) -> list[str]:
        ssml = self.ssml
        rest, self._buf, self._scan = self._buf.strip(), "", 0
        out = split_text(rest, self.config.max_chars, ssml)
        self.chunks_emitted += len(out)
        return out

    @property
    def ssml(self) -> bool:
        """Whether the text is an SSML document (it starts with `<speak`), as far as seen."""
        if self._ssml is None:
            head = self._buf.lstrip()[:6]
            if len(head) < 6:
                return bool(head) and "<speak".startswith(head)
            self._ssml = head == "<speak"
        return self._ssml

    # --- decisions ------------------------------------------------------------------------

    def _next_cut(self) -> int | None:
        """The end of the next chunk, or None until more text shows where it is."""
        buf = self._buf
        spans, held = markup.protected(buf, self.ssml)
        while self._scan < len(buf):
            i = self._scan
            if held is not None and i >= held:
                return None  # markup still arriving
            if not markup.inside(spans, i):  # nothing inside a construct decides a cut
                decision = self._decide(i)
                if decision == _NEED_MORE:
                    return None
                if decision >= 0 and not markup.inside(spans, decision):
                    return decision
            self._scan = i + 1
        return None

    def _decide(self, i: int) -> int:
        buf, cfg, c = self._buf, self.config, self._buf[i]
        if i >= cfg.max_chars and len(buf[:i].strip()) >= cfg.max_chars:
            return i  # no word boundary in max_chars (a URL, a hash, junk): cut anyway
        first = self.chunks_emitted == 0
        if c == "\n":
            return i + 1 if buf[:i].strip() else _NO
        if c in TERMINALS:
            return self._sentence_end(i, first)
        if c in CJK_TERMINALS or c in CJK_CLAUSE_MARKS:
            return self._cjk_end(i, first, sentence=c in CJK_TERMINALS)
        if c.isspace():
            if i == 0 or buf[i - 1].isspace():
                return _NO
            if first and len(buf[:i].split()) >= cfg.first_max_words:
                return self._first_cut(i)
            return self._cap(i)
        if c in CLAUSE_MARKS or (c == "-" and buf[i - 1 : i] == " "):
            if i + 1 == len(buf):
                return _NEED_MORE
            if not buf[i + 1].isspace():
                return _NO  # 3,000 / 10:30 / well-known
            words = len(buf[:i].split())
            if first and words >= cfg.first_min_words:
                return i + 1
            return i + 1 if len(buf[:i].strip()) >= cfg.soft_max_chars else _NO
        return _NO

    def _sentence_end(self, i: int, first: bool) -> int:
        buf = self._buf
        j = i + 1
        while j < len(buf) and (buf[j] in TERMINALS or buf[j] in CLOSERS):
            j += 1
        if j == len(buf):
            return _NEED_MORE
        if not buf[j].isspace():
            return _NO  # 3.14, e.g, example.com, v2.1, "wait!"x
        k = j
        while k < len(buf) and buf[k].isspace():
            if buf[k] == "\n":
                break  # a newline right after the mark settles it
            k += 1
        if k == len(buf):
            return _NEED_MORE
        if buf[k] != "\n":
            if buf[k].islower():
                return _NO  # "approx. five", "“Really?” she asked"
            if buf[i] == "." and self._abbreviation_before(i):
                return _NO
        if not first and len(buf[:j].strip()) < self.config.merge_below_chars:
            return _NO  # a short sentence waits for the next one
        return j

    def _cjk_end(self, i: int, first: bool, sentence: bool) -> int:
        """At a CJK sentence or clause mark: a sentence ends after it (and its closers), as
        an English one does; a clause too, in the first chunk once it has `first_min_words`'
        worth of speech, or once the chunk passes `soft_max_chars`. Lengths by `spoken_len`."""
        buf, cfg = self._buf, self.config
        j = i + 1
        while j < len(buf) and (
            buf[j] in CJK_TERMINALS or buf[j] in CJK_CLOSERS or buf[j] in CLOSERS
        ):
            j += 1
        if j == len(buf):
            return _NEED_MORE  # a closing bracket may follow
        size = spoken_len(buf[:j].strip())
        if sentence:
            return _NO if not first and size < cfg.merge_below_chars else j
        if first and size >= cfg.first_min_words * WORD_CHARS:
            return j
        return j if size >= cfg.soft_max_chars else _NO

    def _cap(self, i: int) -> int:
        """At the end of a word: cut here if the next word would take the chunk past
        `max_chars` (looked at only once the chunk is half full)."""
        buf, limit = self._buf, self.config.max_chars
        if len(buf[:i].strip()) <= limit // 2:
            return _NO
        e = i
        while e < len(buf) and buf[e].isspace():
            e += 1
        while e < len(buf) and not buf[e].isspace():
            e += 1
        if len(buf[:e].strip()) > limit:
            return i
        return _NEED_MORE if e == len(buf) else _NO

    def _first_cut(self, i: int) -> int:
        """At the end of a word past `first_max_words`, in the first chunk."""
        cfg, buf = self.config, self._buf
        if cfg.first_wait_words is None:
            return i
        if len(buf[:i].split()) >= cfg.first_wait_words:
            return self.phrase_cut(len(buf[:i].split())) or i
        e = i
        while e < len(buf) and buf[e].isspace():
            e += 1
        start = e
        while e < len(buf) and not buf[e].isspace():
            e += 1
        if e == len(buf):
            return _NEED_MORE  # the next word is not whole yet
        return i if word_of(buf[start:e]) in PHRASE_STARTS else _NO

    def phrase_cut(self, max_words: int | None = None) -> int | None:
        """Where the text so far may be cut best for a first chunk: before the last phrase
        start past `first_min_words` words (within `max_words`), else None."""
        buf, best = self._buf, None
        words = 0
        i = 0
        while i < len(buf):
            while i < len(buf) and buf[i].isspace():
                i += 1
            start = i
            while i < len(buf) and not buf[i].isspace():
                i += 1
            if start == i or (max_words is not None and words >= max_words):
                break
            if words >= self.config.first_min_words and word_of(buf[start:i]) in PHRASE_STARTS:
                best = start
            words += 1
        return best

    def cut_first_now(self) -> str | None:
        """The first chunk, now, at the best place the text so far allows (a phrase start,
        else the last whole word), if it has `first_min_words` words; for a plan whose text
        comes too slowly to wait for a boundary."""
        if self.chunks_emitted or len(self._buf.split()) < self.config.first_min_words:
            return None
        cut = self.phrase_cut()
        if cut is None:
            cut = len(self._buf.rstrip())
            if not self._buf[cut:]:  # the last word may still grow: cut before it
                cut = self._buf.rstrip().rfind(" ")
            if cut <= 0 or len(self._buf[:cut].split()) < self.config.first_min_words:
                return None
        spans, held = markup.protected(self._buf, self.ssml)
        if markup.inside(spans, cut) or (held is not None and cut > held):
            return None
        chunk, self._buf, self._scan = self._buf[:cut].strip(), self._buf[cut:], 0
        self.chunks_emitted += 1
        return chunk

    def _abbreviation_before(self, i: int) -> bool:
        start = i
        while start > 0 and not self._buf[start - 1].isspace():
            start -= 1
        word = self._buf[start:i].lstrip("\"'([{“‘").lower()
        if word in TITLES or "." in word:
            return True  # Dr. Smith; U.S. Army (a dotted initialism never ends a chunk)
        return len(word) == 1 and word.isalpha()  # an initial: J. R. R. Tolkien


class HeldText:
    """The client decides (the speak WebSocket's `"buffering": "client"`): text is held until
    the client flushes, then goes whole, cut only where it is longer than `max_chars`
    (`split_text`). The chunker's two calls, so a plan runs it in the chunker's place."""

    def __init__(self, max_chars: int = ChunkerConfig.max_chars) -> None:
        self.max_chars = max_chars
        self._buf = ""

    def push(self, text: str) -> list[str]:
        self._buf += text
        return []

    def flush(self) -> list[str]:
        text, self._buf = self._buf, ""
        return split_text(text, self.max_chars, markup.is_ssml(text))


def split_text(text: str, max_chars: int, ssml: bool = False) -> list[str]:
    """`text` stripped, in pieces of at most `max_chars`: each cut after the last sentence end
    that fits, else after the last clause mark, else between the last two words, else
    (one word longer than that) at `max_chars`; never inside markup (`ssml`: an SSML
    document's), which may make a piece longer. Nothing but white space: no piece."""
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > max_chars:
        head = rest[: max_chars + 1]
        cut = _last_mark_before_space(head, TERMINALS + CLOSERS)
        if cut is None:
            cut = _last_mark_before_space(head, CLAUSE_MARKS)
        if cut is None:
            space = head.rfind(" ")
            cut = space if space > 0 else max_chars
        cut = _outside(markup.protected(rest, ssml)[0], cut)
        if cut >= len(rest):
            break
        pieces.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    if rest:
        pieces.append(rest)
    return pieces


def _outside(spans: list[tuple[int, int]], cut: int) -> int:
    """`cut`, or where the construct it falls inside begins (ends, when that is the start)."""
    for start, end in spans:
        if start < cut < end:
            return start if start > 0 else end
    return cut


def _last_mark_before_space(head: str, marks: str) -> int | None:
    """Just past the last of `marks` in `head` that white space follows, if any."""
    for i in range(len(head) - 2, 0, -1):
        if head[i] in marks and head[i + 1].isspace():
            return i + 1
    return None


def word_of(token: str) -> str:
    """A token as a bare lower-case word, for PHRASE_STARTS."""
    return token.strip("\"'()[]{}“”‘’«»,;:").lower()


def spoken_len(text: str) -> float:
    """How long `text` is to say, in English characters: a CJK character counts
    `CJK_CHAR_WEIGHT`."""
    return len(text) + (CJK_CHAR_WEIGHT - 1) * sum(1 for c in text if is_cjk(c))
