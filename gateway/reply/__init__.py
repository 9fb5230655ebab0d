"""One reply: where its text is cut (`chunker`, and the chunk plans in `plan/`, pure), how it
runs (`pipeline`), what it emits (`events`) and what the listener heard of it (`heard`, pure)."""
