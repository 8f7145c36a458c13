"""Reference outputs of timm's BEiT-style relative-position-table resize, for tests/test_table_resize.py.

`vitpe_core.encodings.rpb.resize_rel_table(..., mode="geometric")` re-implements
`timm.layers.resize_rel_pos_bias_table` (its default, non-scipy path: offsets on a geometric
progression, linear interpolation by timm's `RegularGridInterpolator`). timm cannot be installed
beside the project's CPU torch, so this script runs once in a side environment:

    python -m venv /tmp/timmenv
    /tmp/timmenv/bin/pip install torch==2.14.1 torchvision==0.29.1 timm==1.0.31 safetensors
    /tmp/timmenv/bin/python scripts/make_resize_references.py

and writes tests/data/resize_references.safetensors: per case `<name>.in` (the table in timm's
layout), `<name>.out` (timm's result), and in the metadata `cases` (JSON: old / new window,
layout "flat" `((2H-1)(2W-1) + extra, heads)` or "heads" `(heads, 2H-1, 2W-1)`, extra rows) and
the timm / torch versions. `TIMM_USE_SCIPY_INTERP` must be unset (the scipy path is another rule).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import timm
import torch
from safetensors.torch import save_file
from timm.layers.pos_embed_rel import resize_rel_pos_bias_table

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "resize_references.safetensors"
HEADS = 2

CASES = {   # name -> (old window, new window, layout, extra rows)
    "sq7_to_9": ((7, 7), (9, 9), "flat", 0),
    "sq7_to_5": ((7, 7), (5, 5), "flat", 0),
    "sq7_to_9_cls": ((7, 7), (9, 9), "flat", 3),         # BEiT's 3 CLS rows ride along, untouched
    "rect7x5_to_9x8": ((7, 5), (9, 8), "heads", 0),      # non-square, timm's (heads, H, W) layout
    "rect4x6_to_6x5_flat": ((4, 6), (6, 5), "flat", 0),  # non-square flat table (old_window_size given)
    "sq7_to_7x9": ((7, 7), (7, 9), "heads", 0),          # one axis keeps its size (still stretched)
}


def main() -> None:
    if int(os.environ.get("TIMM_USE_SCIPY_INTERP", 0)) > 0:
        raise SystemExit("unset TIMM_USE_SCIPY_INTERP: the references are for timm's default (non-scipy) path")
    g = torch.Generator().manual_seed(0)
    tensors, meta = {}, {}
    for name, (old, new, layout, extra) in CASES.items():
        src = (2 * old[0] - 1, 2 * old[1] - 1)
        dst = (2 * new[0] - 1, 2 * new[1] - 1)
        if layout == "flat":
            table = torch.randn(src[0] * src[1] + extra, HEADS, generator=g)
            shape = (dst[0] * dst[1] + extra, HEADS)
            out = resize_rel_pos_bias_table(table, new, shape, old_window_size=old)
        else:
            table = torch.randn(HEADS, *src, generator=g)
            shape = (HEADS, *dst)
            out = resize_rel_pos_bias_table(table, new, shape)
        assert tuple(out.shape) == shape, (name, tuple(out.shape), shape)
        tensors[f"{name}.in"], tensors[f"{name}.out"] = table.contiguous(), out.contiguous()
        meta[name] = dict(old=list(old), new=list(new), layout=layout, extra=extra)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(OUT), metadata={"cases": json.dumps(meta), "timm": timm.__version__,
                                           "torch": torch.__version__})
    print(f"wrote {OUT} ({len(meta)} cases, timm {timm.__version__}, torch {torch.__version__})")


if __name__ == "__main__":
    main()
