"""`seeded.SeededSource`: a segment's harmonic source drawn from its own seed, whatever other
sources in the process draw meanwhile."""

from __future__ import annotations

import threading

import torch
from torch import nn

from model_server.engines.seeded import SeededSource


class _Drawing(nn.Module):  # type: ignore[misc]
    """A stand-in for kokoro's `SineGen`: its draws from torch's global generator, in several
    steps (as the initial phases, then the noise)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.rand(x.shape) + x for _ in range(8)])


def test_a_seeded_source_draws_the_same_numbers_each_time() -> None:
    """(Other tests' servers may draw from the global generator meanwhile: nothing here reads
    it.)"""
    source = SeededSource(_Drawing(), devices=[])
    x = torch.zeros(16)
    with source.seeded(1234):
        first = source(x)
        second = source(x)
    assert torch.equal(first, second)
    assert not torch.equal(source(x), first)  # outside: kokoro's own, unseeded draws
    with source.seeded(4321):
        assert not torch.equal(source(x), first)
    with source.seeded(1234):
        assert torch.equal(source(x), first)


def test_two_engines_sources_drawing_at_once_each_draw_their_own_seeds() -> None:
    """Engines in one process (two servers, or a server and a calibration) each have a source
    over the one global generator: two drawing seeded at once on two threads, a third
    unseeded, each seeded one gets exactly its seed's numbers (a lock per source let one seed
    the generator inside the other's draws, and unseeded draws took numbers from a seeded
    fork: the same front pass gave another harmonic source now and then)."""
    x = torch.zeros(256)
    sources = [SeededSource(_Drawing(), devices=[]) for _ in range(2)]
    expected = []
    for seed, source in enumerate(sources):
        with source.seeded(seed):
            expected.append(source(x))
    start = threading.Barrier(3)
    wrong = [0, 0]

    def draw(i: int) -> None:
        start.wait()
        with sources[i].seeded(i):
            for _ in range(300):
                if not torch.equal(sources[i](x), expected[i]):
                    wrong[i] += 1

    def unseeded() -> None:  # a third engine's whole calls, its source's draws not seeded
        other = SeededSource(_Drawing(), devices=[])
        start.wait()
        for _ in range(300):
            other(x)

    threads = [threading.Thread(target=draw, args=(i,)) for i in range(2)]
    threads.append(threading.Thread(target=unseeded))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [0, 0]
