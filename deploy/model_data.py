"""SageMaker model data for the GPU image: a Kokoro checkpoint directory as `model.tar.gz`.

SageMaker unpacks the archive into `/opt/ml/model`, where the torch engine looks by default, so
its root holds the checkpoint's files as `checkpoint.locate` expects them: config.json, the
.pth and voices/*.pt. Nothing else from the directory goes in.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from model_server.engines import checkpoint


def pack(model_dir: Path, out: Path) -> list[str]:
    """Write `out` from the checkpoint in `model_dir`; returns the archive's member names."""
    files = checkpoint.locate(model_dir)  # the same checks the server makes at start-up
    members = [files.config, files.weights]
    if files.voices_dir is not None:
        members += sorted(p for p in files.voices_dir.glob("*.pt") if p.is_file())
    names = [str(p.relative_to(model_dir)) for p in members]
    # the weights hardly compress: the fastest level keeps packing quick
    with tarfile.open(out, "w:gz", compresslevel=1) as tar:
        for path, name in zip(members, names, strict=True):
            tar.add(path, arcname=name, recursive=False)
    return names


def upload(path: Path, s3_uri: str, s3: Any) -> str:
    """Upload `path` to `s3://bucket/key`; returns the URI for `--model-data`."""
    parsed = urlparse(s3_uri)
    if parsed.scheme != "s3" or not parsed.netloc or not parsed.path.strip("/"):
        raise ValueError(f"expected s3://bucket/key, got {s3_uri!r}")
    s3.upload_file(str(path), parsed.netloc, parsed.path.lstrip("/"))
    return f"s3://{parsed.netloc}/{parsed.path.lstrip('/')}"
