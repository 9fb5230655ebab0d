"""Text sources: each yields the answer's text as it is written (deltas)."""
