"""`bench.slot_report`: a serial tail (one slot busy after the others ran dry) and the steady
occupancy read right off synthetic slot timings."""

from __future__ import annotations

from pathlib import Path

from bench.slot_report import read, report


def test_a_serial_tail_shows_and_the_steady_middle_is_full(tmp_path: Path) -> None:
    lines = []
    for cycle in range(40):  # 4 slots, 0.25 s requests back to back
        for s in range(4):
            t = cycle * 0.25
            lines.append(f"{t:.6f} {t:.6f} {t + 0.25:.6f} {t + 0.25:.6f} http://x/p{cycle}-{s}")
    for k in range(3):  # then three pages one after the other (a batch in one slot)
        t = 10.0 + k * 0.25
        lines.append(f"{t:.6f} {t:.6f} {t + 0.24:.6f} {t + 0.25:.6f} http://x/tail{k}")
    f = tmp_path / "slots-1.txt"
    f.write_text("\n".join(lines) + "\n")
    rows = read([str(f)])
    assert len(rows) == 163
    text = report(rows, slots=4)
    assert "slots busy 4.00 of 4, waiting for one 0.00" in text
    assert "10.50s:1" in text  # the serial tail
    assert text.rstrip().endswith("http://x/tail2")
