"""How the report embeds arrays and figures compactly (no Streamlit, no Plotly import).

* `pack(a)`: a float array as float16, little-endian, byte-shuffled (all low bytes, then all
  high bytes: the high bytes, sign and exponent, repeat and compress well), gzip-compressed and
  base64-encoded, with its shape: `{"shape": [...], "dtype": "f2", "gz": "..."}`; `pack_ints`
  the same for integers, in the smallest integer type that holds them. `unpack` reverses both
  (the tests decode what a report embeds with it; `report.js` does the same in the page).
* `compact_figure(spec)`: a Plotly figure's JSON dict with every typed array (Plotly's
  `{"dtype": "f8", "bdata": ...}`) packed so (`{"vitpe_packed": ...}`); the page revives them
  into nested arrays before drawing. Float16 draws the same maps (3 significant digits).
* `script_json(obj)`: JSON that is safe inside `<script type="application/json">` (no `</`).
"""
from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import numpy as np

F16_MAX = float(np.finfo(np.float16).max)
INT_CODES = ("i1", "u1", "i2", "u2", "i4", "u4")        # the integer types a packed array may have


def _shuffled_gzip_b64(a: np.ndarray) -> str:
    """The bytes of `a` (little-endian) byte-shuffled (every element's first byte, then every
    second byte, ...), gzip (level 9, no timestamp: the same array gives the same text), base64."""
    raw = np.ascontiguousarray(a).view(np.uint8).reshape(-1, a.dtype.itemsize)       # (n, itemsize)
    return base64.b64encode(gzip.compress(raw.T.tobytes(), 9, mtime=0)).decode("ascii")


def pack(a: np.ndarray) -> dict[str, Any]:
    """A float array as `{"shape", "dtype": "f2", "gz"}`: float16 (values clipped to ±65504, NaN
    kept), byte-shuffled, gzip, base64."""
    a = np.clip(np.asarray(a, dtype=np.float32), -F16_MAX, F16_MAX)
    return {"shape": list(a.shape), "dtype": "f2", "gz": _shuffled_gzip_b64(a.astype("<f2"))}


def pack_ints(a: np.ndarray) -> dict[str, Any]:
    """An integer array as `pack` does it, in the smallest of `INT_CODES` that holds it."""
    a = np.asarray(a)
    lo, hi = (int(a.min()), int(a.max())) if a.size else (0, 0)
    code = next((c for c in INT_CODES if np.iinfo(np.dtype(c)).min <= lo and hi <= np.iinfo(np.dtype(c)).max), None)
    if code is None:
        raise ValueError(f"integers {lo}..{hi} do not fit 32 bits")
    return {"shape": list(a.shape), "dtype": code, "gz": _shuffled_gzip_b64(a.astype("<" + code))}


def unpack(packed: dict[str, Any]) -> np.ndarray:
    """`pack` / `pack_ints` output back to an array of its shape (float16 as float32)."""
    dtype = np.dtype("<" + packed["dtype"])
    data = np.frombuffer(gzip.decompress(base64.b64decode(packed["gz"])), dtype=np.uint8)
    raw = data.reshape(dtype.itemsize, -1).T.copy()                               # (n, itemsize)
    out = raw.view(dtype).reshape(packed["shape"])
    return out.astype(np.float32) if packed["dtype"] == "f2" else out


def packed_bytes(packed: dict[str, Any]) -> int:
    """How many characters a packed array adds to the page."""
    return len(packed["gz"])


def _typed(node: dict) -> dict:
    """One Plotly typed array (`dtype`, `bdata`, maybe `shape` as "r, c") packed: floats as
    float16, integers in the smallest type; the page turns it back into nested arrays."""
    a = np.frombuffer(base64.b64decode(node["bdata"]), dtype=np.dtype(node["dtype"]).newbyteorder("<"))
    shape = node.get("shape")
    if shape is not None:
        a = a.reshape([int(s) for s in str(shape).split(",")] if isinstance(shape, str) else shape)
    return {"vitpe_packed": pack(a) if a.dtype.kind == "f" else pack_ints(a)}


def compact_figure(spec: Any) -> Any:
    """A Plotly figure as JSON (`json.loads(fig.to_json())`) with every typed array packed
    (`_typed`: `report.js` revives them before drawing), walked in full (traces, frames, layout)."""
    if isinstance(spec, dict):
        if "bdata" in spec and "dtype" in spec:
            return _typed(spec)
        return {k: compact_figure(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [compact_figure(v) for v in spec]
    return spec


def revive(spec: Any) -> Any:
    """`compact_figure` undone in Python (as `report.js` does it): packed arrays as nested lists."""
    if isinstance(spec, dict):
        if "vitpe_packed" in spec:
            return unpack(spec["vitpe_packed"]).tolist()
        return {k: revive(v) for k, v in spec.items()}
    if isinstance(spec, list):
        return [revive(v) for v in spec]
    return spec


def script_json(obj: Any) -> str:
    """`obj` as JSON to place inside a `<script type="application/json">` element: `<`, `>` and
    `&` escaped as JSON unicode escapes, so no `</script>` or `<!--` can end it early."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
