"""Text "image" captchas: digits drawn in a fixed 5x7 dot-matrix font.

The format is documented glyph by glyph in demo/README.md so a crawler can ship a
deterministic recognizer; `solve` here is the reference one (used by our tests).
"""

from __future__ import annotations

import random

GLYPH_WIDTH = 5
GLYPH_HEIGHT = 7
GAP = 1  # blank columns between glyphs
ON, OFF = "#", "."

FONT: dict[str, tuple[str, ...]] = {
    "0": (".###.", "#...#", "#..##", "#.#.#", "##..#", "#...#", ".###."),
    "1": ("..#..", ".##..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "2": (".###.", "#...#", "....#", "...#.", "..#..", ".#...", "#####"),
    "3": ("#####", "...#.", "..#..", "...#.", "....#", "#...#", ".###."),
    "4": ("...#.", "..##.", ".#.#.", "#..#.", "#####", "...#.", "...#."),
    "5": ("#####", "#....", "####.", "....#", "....#", "#...#", ".###."),
    "6": ("..##.", ".#...", "#....", "####.", "#...#", "#...#", ".###."),
    "7": ("#####", "....#", "...#.", "..#..", ".#...", ".#...", ".#..."),
    "8": (".###.", "#...#", "#...#", ".###.", "#...#", "#...#", ".###."),
    "9": (".###.", "#...#", "#...#", ".####", "....#", "...#.", ".##.."),
}


def random_answer(rng: random.Random, length: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(length))


def render(answer: str) -> str:
    """The image: GLYPH_HEIGHT rows joined by "\\n"; glyph i starts at column i*(5+GAP)."""
    sep = OFF * GAP
    return "\n".join(sep.join(FONT[ch][row] for ch in answer) for row in range(GLYPH_HEIGHT))


def solve(image: str) -> str:
    """Reference recognizer: cut fixed-width cells and pick the nearest glyph (Hamming)."""
    rows = image.split("\n")
    count = (len(rows[0]) + GAP) // (GLYPH_WIDTH + GAP)
    out = []
    for i in range(count):
        start = i * (GLYPH_WIDTH + GAP)
        cell = [row[start : start + GLYPH_WIDTH] for row in rows]
        out.append(
            min(
                FONT,
                key=lambda d: sum(
                    a != b
                    for r1, r2 in zip(FONT[d], cell, strict=True)
                    for a, b in zip(r1, r2, strict=True)
                ),
            )
        )
    return "".join(out)
