"""`model-server-check URL`: the reference's post-deployment check against a running server.

One session, binary frames (as SageMaker delivers them): "Hello there.", "This is a post
deployment check.", "It has three sentences." must give three `synthesis_complete` events, each
with 0.8-4 s of audio whose PCM length is 2 x samples.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from websockets.asyncio.client import connect

from kokoro_contract import protocol
from kokoro_contract.protocol import CompleteMsg, ErrorMsg

SENTENCES = ("Hello there.", "This is a post deployment check.", "It has three sentences.")


async def check(url: str, voice: str | None) -> list[str]:
    problems: list[str] = []
    async with connect(url.rstrip("/") + protocol.PATH) as ws:
        for i, text in enumerate(SENTENCES):
            rid = f"check-{i}"
            await ws.send(protocol.synthesize_message(text, rid, voice).encode())  # binary
            pcm = 0
            async for frame in ws:
                if isinstance(frame, bytes):
                    pcm += len(frame)
                    continue
                match protocol.read_server_frame(frame):
                    case CompleteMsg(request_id=done, audio_bytes=audio_bytes) as event if (
                        done == rid
                    ):
                        seconds = event.total_duration_s
                        ok = 0.8 <= seconds <= 4.0 and pcm == audio_bytes and pcm % 2 == 0
                        print(
                            f"{'ok  ' if ok else 'FAIL'} {text!r}: {seconds:.2f} s audio, "
                            f"{pcm} bytes PCM ({pcm // 2} samples), {event.elapsed_s:.2f} s"
                        )
                        if not ok:
                            problems.append(f"{text!r}: {event}")
                        break
                    case ErrorMsg(code=code, message=message):
                        problems.append(f"{text!r}: {code}: {message}")
                        print(f"FAIL {text!r}: {message}")
                        break
        await ws.send(protocol.close_message())
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(prog="model-server-check", description=__doc__)
    parser.add_argument("url", nargs="?", default="ws://127.0.0.1:8080")
    parser.add_argument("--voice")
    args = parser.parse_args()
    problems = asyncio.run(check(args.url, args.voice))
    print("post-deployment check:", "FAILED" if problems else "passed (3 of 3)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
