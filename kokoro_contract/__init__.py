"""What the gateway and the model server both speak and use, and nothing else.

- `protocol`: the bidirectional wire contract (`/invocations-bidirectional-stream`) for both
  sides: parsing and building client messages and server messages, and the frame rule.
- `audio`: the PCM the model server sends (s16le, 24 kHz, mono) and the streaming WAV header.
- `formats`: the one registry of audio formats (MIME, container, codec settings, OpenAI names).
- `limits`: request limits and validation (text length, speed, voice names, ids).
- `errors`, `http_errors`, `ws_sender`: the error type and its HTTP and WebSocket mapping.
- `speed`: the learned synthesis speed, and the priors both services start from.
- `load`: the model server's `/load` answer and its JSON, and the sizes both services count
  by (a typical first chunk and segment in phonemes, the largest decoder window).
- `asks`: the unit a gateway's admission counts on a model server (one reply's asked-for
  synthesis).
- `settings`: settings dataclasses from flags and environment variables.

Both services import this package; neither imports the other.
"""
