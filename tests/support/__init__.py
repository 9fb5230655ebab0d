"""Helpers for the tests: servers on loopback, clients, fakes, codec checks. No tests here."""
