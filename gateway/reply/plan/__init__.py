"""A reply's chunk plan, pure: what a plan is (`protocol`), the playback plan's settings
(`config`), the rates it learns (`rates`), its timeline (`timeline`), and the two plans:
`sentence_plan` (one chunk per sentence) and `playback_plan` (`ChunkPlan`, chunks sized to
the listener's buffer)."""
