"""JSON text of many small objects of one shape, built column by column in numpy: the writer of the per-CTA
events, of which one profiled cycle can hold 10^5 (json.dumps of them as dicts took 0.3 s for 65,536 CTAs,
more than the profiled steps themselves).

Every row is the same template: fixed text between integer columns. Each number is written right-aligned
in its column's width, padded with spaces before it (JSON allows whitespace around a value, not leading
zeros), so all rows have one length and the whole block is one uint8 matrix filled by broadcast arithmetic.
A column with `decimals` d holds value * 10**d as an integer and is written with d digits after the point
("ts": 1234.567 from 1234567), which is how trace times in microseconds with ns resolution are written.
"""
from __future__ import annotations

import numpy as np

_SPACE, _MINUS, _POINT, _ZERO = ord(" "), ord("-"), ord("."), ord("0")
_CHUNK = 4  # digits per table lookup


def _chunk_table() -> np.ndarray:
    """(2 * 10**_CHUNK + 1, _CHUNK) uint8: rows 0.. the chunk zero-padded ("0042"), rows 10**_CHUNK.. the chunk
    space-padded ("  42"), the last row blank: a number's leading chunk, its later chunks, and nothing."""
    n = 10 ** _CHUNK
    zero = np.array([f"{i:0{_CHUNK}d}".encode() for i in range(n)])
    pad = np.array([f"{i:>{_CHUNK}d}".encode() for i in range(n)])
    table = np.frombuffer(b"".join(zero.tolist() + pad.tolist() + [b" " * _CHUNK]), np.uint8)
    return table.reshape(2 * n + 1, _CHUNK)


_TABLE = _chunk_table()


def _width(values: np.ndarray, decimals: int) -> int:
    """Characters of a column's numbers: a sign, the digits (at least one before the point), the point."""
    digits = max(len(str(int(np.abs(values).max(initial=0)))), decimals + 1)
    return 1 + -(-digits // _CHUNK) * _CHUNK + (1 if decimals else 0)


def _write_numbers(out: np.ndarray, values: np.ndarray, decimals: int) -> None:
    """Fill `out` ((n, _width) uint8) with each value (an int64 scaled by 10**decimals) as right-aligned JSON
    number text."""
    mag = np.abs(values)
    base, n_chunks = 10 ** _CHUNK, (out.shape[1] - 1 - (1 if decimals else 0)) // _CHUNK
    digits = np.empty((len(values), n_chunks, _CHUNK), np.uint8)
    leading = np.ones(len(values), bool)
    for i, k in enumerate(range(n_chunks - 1, -1, -1)):
        chunk = (mag // base ** k) % base
        # before a number's first non-zero chunk: blank; its first chunk: space-padded; later ones: zero-padded
        row = np.where(leading, np.where((chunk == 0) & (k > 0), 2 * base, chunk + base), chunk)
        digits[:, i] = _TABLE[row]
        leading &= chunk == 0
    digits = digits.reshape(len(values), -1)
    if decimals:  # "0.005": every digit from the one before the point on is written
        tail = digits[:, -decimals - 1:]
        tail[tail == _SPACE] = _ZERO
        point = out.shape[1] - decimals - 1
        out[:, 1:point], out[:, point], out[:, point + 1:] = digits[:, :-decimals], _POINT, digits[:, -decimals:]
    else:
        out[:, 1:] = digits
    out[:, 0] = _SPACE  # room for a minus sign
    negative = np.flatnonzero(values < 0)
    if len(negative):
        out[negative, (out[negative] != _SPACE).argmax(axis=1) - 1] = _MINUS


def rows(texts: list, columns: list, decimals: list | None = None) -> bytes:
    """The rows texts[0] col_0 texts[1] col_1 ... texts[k], joined with commas (a JSON array's inside).

    texts: k + 1 str pieces (the template around the columns); columns: k int arrays of one length n;
    decimals: per column, the digits after the point (default 0: integers)."""
    if len(texts) != len(columns) + 1:
        raise ValueError(f"{len(columns)} columns need {len(columns) + 1} text pieces, got {len(texts)}")
    decimals = [0] * len(columns) if decimals is None else list(decimals)
    columns = [np.asarray(c, np.int64) for c in columns]
    n = len(columns[0]) if columns else 0
    if any(len(c) != n for c in columns):
        raise ValueError("columns must all have the same length")
    if n == 0:
        return b""
    raw = [np.frombuffer(t.encode(), np.uint8) for t in texts[:-1]] + \
        [np.frombuffer(texts[-1].encode() + b",", np.uint8)]
    widths = [_width(c, d) for c, d in zip(columns, decimals)]
    out = np.empty((n, sum(map(len, raw)) + sum(widths)), np.uint8)
    at = 0
    for i, text in enumerate(raw):
        out[:, at:at + len(text)] = text
        at += len(text)
        if i < len(columns):
            _write_numbers(out[:, at:at + widths[i]], columns[i], decimals[i])
            at += widths[i]
    return out.tobytes()[:-1]  # no comma after the last row
