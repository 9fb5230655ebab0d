"""Settings dataclasses from command-line flags and environment variables.

Every field of a frozen dataclass becomes `--field-name`, also settable through
`PREFIX_FIELD_NAME`; flags win over the environment, which wins over the defaults. `--help`
shows each default, but of a secret (an API key, a token) only whether it is set.
"""

from __future__ import annotations

import argparse
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
SECRET_WORDS = frozenset({"key", "keys", "secret", "token", "password"})


def is_secret(name: str) -> bool:
    """A field whose value `--help` must never print: `openai_api_key`, not `max_tokens`."""
    return not SECRET_WORDS.isdisjoint(name.lower().split("_"))


def parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise argparse.ArgumentTypeError(f"not a boolean: {value!r}")


def _converter(annotation: Any) -> Callable[[str], object]:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) and len(args) == 1:
        annotation = args[0]
    if annotation is bool:
        return parse_bool
    if annotation in (int, float, Path):
        return typing.cast(Callable[[str], object], annotation)
    return str


def parse_dataclass[T](
    cls: type[T],
    *,
    prog: str,
    description: str,
    env_prefix: str,
    help: Mapping[str, str],
    choices: Mapping[str, Sequence[str]] | None = None,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> T:
    env = os.environ if env is None else env
    hints = typing.get_type_hints(cls)
    base = cls(**(overrides or {}))
    parser = argparse.ArgumentParser(prog=prog, description=description)
    for f in fields(cls):  # type: ignore[arg-type]
        env_name = env_prefix + f.name.upper()
        convert = _converter(hints[f.name])
        default = getattr(base, f.name)
        if env_name in env:
            try:
                default = convert(env[env_name])
            except (ValueError, argparse.ArgumentTypeError) as exc:
                parser.error(f"{env_name}: {exc}")
        shown = ("set" if default else "not set") if is_secret(f.name) else default
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            default=default,
            type=convert,
            choices=(choices or {}).get(f.name),
            help=f"{help.get(f.name, '')} (env {env_name}; default {shown})",
        )
    return cls(**vars(parser.parse_args(argv)))
