"""Twilio Media Streams: a voice's mu-law audio as Twilio's own messages, paced (`media`, pure)."""
