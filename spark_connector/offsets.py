"""Stream entry ids and the source's offsets.

An offset is ``{topic: {partition: last entry id read}}`` (partition as a string: JSON keys), serialized by Spark as
JSON. Entry ids are compared as ``(ms, seq)`` integers, never as text ("9-0" < "10-0").
"""

from __future__ import annotations

EARLIEST = "earliest"
LATEST = "latest"
START_ID = "0-0"
MAX_SEQ = 18446744073709551615


def parse_entry_id(entry_id: str) -> tuple[int, int]:
    """``"1700000000000-3"`` -> ``(1700000000000, 3)``; ValueError for anything else."""
    ms, _, seq = str(entry_id).partition("-")
    if not ms.isdigit() or (seq and not seq.isdigit()):
        raise ValueError(f"not a stream entry id: {entry_id!r}")
    return int(ms), int(seq or 0)


def later(a: str, b: str) -> str:
    return a if parse_entry_id(a) >= parse_entry_id(b) else b


def earlier(a: str, b: str) -> str:
    return a if parse_entry_id(a) <= parse_entry_id(b) else b


def ms_upper_bound(ms: int) -> str:
    """The largest entry id of millisecond ``ms``: an inclusive range end that takes all of that millisecond."""
    return f"{ms}-{MAX_SEQ}"
