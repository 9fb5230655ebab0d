"""Kokoro's English voice packs from the Hugging Face hub, for the onnx engine.

The registry ships Japanese packs only; the hub repo `hexgrad/Kokoro-82M` holds the English
ones (`voices/a?_*.pt` American, `voices/b?_*.pt` British, about 0.5 MB each, (510, 1, 256)
float32 tensors as `torch.save` writes them). They are fetched once, with huggingface_hub's
`snapshot_download` (its progress bar), into the Hugging Face cache, where the torch engine's
checkpoint goes too (`HF_HUB_CACHE`, `HF_HOME`); from then on they are read from there without
a request.

What the set is, and what each file must be, comes from the hub's tree listing, which
huggingface_hub caches beside the files (`trees/<commit>.json`: each file's size, its LFS
sha256 or its git blob id). Every start checks every file against it (size, hash) and loads
it as a (510, 1, 256) pack. A file that does not match is removed from the cache (its snapshot
link and its blob), so a truncated or corrupt download is never used and the next start
fetches it again; until every file matches, the engine keeps the registry's packs. A file that
matches but is no Kokoro pack (the hub's own, so fetching it again is no cure) is skipped, and
the note says so.

Nothing here is fatal: the hub unreachable, `HF_HUB_OFFLINE`, huggingface_hub not installed,
a failed check: the outcome carries no packs and a phrase that says why, for the ready line.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kokoro_contract.errors import brief
from model_server.engine_choice import HUB_REPO
from model_server.engines.base import VoicePack
from model_server.engines.voices import VoicePackError, load_file

log = logging.getLogger(__name__)

MODES = ("auto", "off")
PATTERNS = ["voices/a?_*.pt", "voices/b?_*.pt"]  # Kokoro's American and British English packs
PACK_SHAPE = (510, 1, 256)
API_TIMEOUT_S = 10.0  # the first request: how long an unanswering hub may hold the load


@dataclass(frozen=True)
class HubVoices:
    packs: Mapping[str, VoicePack] = field(default_factory=dict)  # empty: none to add
    source: str = ""  # where they came from, as GET /voices shows it: REPO@COMMIT
    note: str = ""  # for the ready line: what was loaded, or why none

    @property
    def summary(self) -> str:
        return f"English voices {self.note}"


def _none(why: str) -> HubVoices:
    return HubVoices(note=f"none, the registry's packs only ({why})")


def english_voices(
    mode: str = "auto",
    *,
    endpoint: str | None = None,
    cache_dir: Path | None = None,
    offline: bool | None = None,
) -> HubVoices:
    """The English packs: from the cache when they are there and check, else (mode `auto`,
    online) fetched once. `endpoint`, `cache_dir`, `offline`: huggingface_hub's own settings
    (`HF_ENDPOINT`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE`) unless given."""
    if mode == "off":
        return _none("--english-voices off")
    if mode not in MODES:
        raise ValueError(f"unknown --english-voices {mode!r}; use {' or '.join(MODES)}")
    try:
        from huggingface_hub import constants
    except ImportError:
        return _none("huggingface_hub is not installed")
    offline = constants.is_offline_mode() if offline is None else offline
    cached = _from_cache(cache_dir, "main")
    if isinstance(cached, HubVoices):
        return cached
    if offline:
        return _none(f"HF_HUB_OFFLINE is set and {cached}")
    commit, why = _fetch(endpoint, cache_dir)
    if commit is None:
        return _none(why)
    checked = _from_cache(cache_dir, commit, fetched_now=True)
    if isinstance(checked, str):
        return _none(f"the download failed its check: {checked}")
    return checked


def _fetch(endpoint: str | None, cache_dir: Path | None) -> tuple[str | None, str]:
    """(the commit fetched, "") or (None, why not)."""
    from huggingface_hub import HfApi, snapshot_download

    client_log = logging.getLogger("httpx2")  # huggingface_hub's HTTP client: a line a request
    if client_log.level == logging.NOTSET:  # (unless set on purpose): the progress bar says it
        client_log.setLevel(logging.WARNING)
    try:  # first a request with a timeout: snapshot_download's own listing calls wait forever
        info = HfApi(endpoint=endpoint).model_info(HUB_REPO, revision="main", timeout=API_TIMEOUT_S)
    except Exception as exc:  # any failure of the hub's is "no English voices", never fatal
        import httpx2

        unreachable = isinstance(exc, (httpx2.TransportError, ConnectionError))
        return None, f"the hub {'is unreachable' if unreachable else 'refused'}: {brief(exc)}"
    log.info("english voices: fetching %s from %s", " ".join(PATTERNS), HUB_REPO)
    try:
        folder = snapshot_download(  # revision main: it records refs/main for the next start
            HUB_REPO,
            revision="main",
            allow_patterns=PATTERNS,
            endpoint=endpoint,
            cache_dir=cache_dir,
        )
    except Exception as exc:
        return None, f"the download failed: {brief(exc)}"
    return Path(str(folder)).name or str(info.sha), ""


def _from_cache(
    cache_dir: Path | None, revision: str, fetched_now: bool = False
) -> HubVoices | str:
    """The packs of `revision` in the cache, every one checked; else why not (after removing
    every file that failed its check)."""
    from huggingface_hub import get_cached_repo_tree, snapshot_download

    try:
        folder = Path(
            snapshot_download(
                HUB_REPO,
                revision=revision,
                allow_patterns=PATTERNS,
                cache_dir=cache_dir,
                local_files_only=True,
            )
        )
        tree = get_cached_repo_tree(HUB_REPO, revision=folder.name, cache_dir=cache_dir)
    except Exception as exc:  # not cached, partly cached, or cached without its listing
        log.debug("english voices: not in the cache: %s", brief(exc))
        return "none are cached"
    by_path = {entry.path: entry for entry in tree}
    wanted = [p for p in by_path if any(fnmatch.fnmatchcase(p, pat) for pat in PATTERNS)]
    if not wanted:
        return f"{HUB_REPO}@{folder.name[:7]} has no English voices"
    packs: dict[str, VoicePack] = {}
    corrupt: list[str] = []
    skipped: list[str] = []
    for name in sorted(wanted):
        path = folder / name
        problem = _check(path, by_path[name])
        if problem is not None:  # not the hub's file: away with it, to be fetched again
            corrupt.append(problem)
            _remove(path)
            continue
        problem = _load(path, packs)
        if problem is not None:  # the hub's own file, not a Kokoro pack: fetching is no cure
            skipped.append(problem)
    if corrupt:
        more = f" (and {len(corrupt) - 1} more)" if len(corrupt) > 1 else ""
        log.warning("english voices: removed from the cache: %s", "; ".join(corrupt))
        return f"{corrupt[0]}{more}"
    if skipped:
        log.warning("english voices: skipped: %s", "; ".join(skipped))
    if not packs:
        return f"none of {HUB_REPO}@{folder.name[:7]}'s English files is a voice pack"
    source = f"{HUB_REPO}@{folder.name[:7]}"
    how = "fetched from the hub" if fetched_now else "from the hub cache"
    extra = f", {len(skipped)} skipped ({skipped[0]})" if skipped else ""
    return HubVoices(packs, source, f"{len(packs)} {how} ({source}){extra}")


def _check(path: Path, entry: Any) -> str | None:
    """What is wrong with the cached file `path` against its listing `entry`, if anything."""
    lfs = entry.lfs
    size = int(lfs.size if lfs is not None else entry.size)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"{path.name}: unreadable: {exc}"
    if len(data) != size:
        return f"{path.name}: {len(data)} bytes, the hub lists {size}"
    if lfs is not None:
        digest = hashlib.sha256(data).hexdigest()
        expected = str(lfs.sha256)
    else:  # a file in git itself: its blob id is the sha1 of a header and the content
        digest = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        expected = str(entry.blob_id)
    if digest != expected:
        return f"{path.name}: hash {digest[:12]}…, the hub lists {expected[:12]}…"
    return None


def _load(path: Path, packs: dict[str, VoicePack]) -> str | None:
    """Load `path` into `packs` if it is a Kokoro pack; else what it is instead."""
    try:
        pack = load_file(path)[path.stem]
    except VoicePackError as exc:
        return str(exc)
    if pack.shape != PACK_SHAPE:
        return f"{path.name}: shape {pack.shape}, expected {PACK_SHAPE}"
    packs[path.stem] = pack
    return None


def _remove(path: Path) -> None:
    """A cached file gone, its snapshot link and the blob it points to, so the next fetch
    downloads it again (huggingface_hub trusts any file it finds in place)."""
    blob = path.resolve()
    for target in (path, blob):
        try:
            target.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("english voices: cannot remove %s: %s", target, exc)
