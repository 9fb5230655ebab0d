"""How the speech sounds, measured offline: the corpus, the judges (DistillMOS for quality,
PocketSphinx for intelligibility) and the word error rate. Used by `make bench-quality` and by
the quality guards in the tests; no service imports it."""
