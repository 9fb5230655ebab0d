"""TTS transports: how text reaches the Kokoro model server and audio comes back."""
