"""Cutting passages into encoder batches that pad little.

A transformer batch costs about (rows x longest row) tokens, plus a fixed price per call. Sorting by length and
cutting every ``batch_size`` rows (what sentence-transformers does) pads little when there are thousands of
passages, but an ingest batch holds about a hundred: a slice of 32 then spans a wide range of lengths and the
short rows pay for the long one. ``length_slices`` cuts the sorted order where the padding saved outweighs the
price of one more call, by dynamic programming over the cut points (exact; O(n x batch_size))."""

from __future__ import annotations

from collections.abc import Sequence

CALL_TOKENS = 64
"""The fixed price of one more encoder call, in padded tokens (session / forward overhead, ~0.3 ms on the
MiniLM towers here: a quarter of one 256-token row). Small enough that a few short passages never wait for a
long one, large enough that a batch is not cut into single rows."""


def length_slices(lengths: Sequence[int], batch_size: int, call_tokens: int = CALL_TOKENS) -> list[list[int]]:
    """Indices into ``lengths``, longest first, cut into batches of at most ``batch_size`` rows that minimise
    sum(rows x longest row) + call_tokens x batches. Every index appears exactly once."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n, cap = len(order), max(1, batch_size)
    if n == 0:
        return []
    width = [max(1, lengths[i]) for i in order]  # longest first: a slice [a, b) pads to width[a]
    best = [0.0] * (n + 1)  # best[b]: cheapest cut of order[b:]
    cut = [n] * (n + 1)
    for a in range(n - 1, -1, -1):
        best[a] = float("inf")
        for b in range(a + 1, min(n, a + cap) + 1):
            cost = call_tokens + (b - a) * width[a] + best[b]
            if cost <= best[a]:  # ties: the longer slice, so full batches come first
                best[a], cut[a] = cost, b
    slices, a = [], 0
    while a < n:
        slices.append(order[a:cut[a]])
        a = cut[a]
    return slices
