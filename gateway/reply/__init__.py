"""One reply: where its text is cut (`chunker`, `chunk_plan`, pure), how it runs (`pipeline`),
what it emits (`events`) and what the listener heard of it (`heard`, pure)."""
