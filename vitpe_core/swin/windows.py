"""What the bias explorer shows for a Swin: the window a patch sits in, at one block.

A Swin block attends inside `w x w` windows of its stage's token grid; odd blocks roll the grid by
`shift` first, and the mask keeps a token to the tokens of its own region, so on the unrolled grid
each token attends to one rectangle: rows between consecutive window lines `shift + k·w` (and the
grid's edges), the same for columns. `window_rows` places the bias and attention rows of a clicked
patch's token on the stage's full grid (NaN outside its window), with those lines, so a page can
draw them over the image. The bias is what the model adds to the logits: Swin's relative position
bias table, looked up; Swin-V2's continuous position bias `16 sigmoid(CPB)`.

Torch in, numpy out, no Streamlit (like `analysis`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:   # torch is imported where it is used: the app draws its first page before torch is loaded
    import torch

    from .model import SwinTransformer


@dataclass(frozen=True)
class WindowRows:
    """One patch's window at one block. Maps are on the stage's token grid `(Hs, Ws)`; `token`
    is the clicked patch's token there (a stage-`s` token covers `2**s x 2**s` first-stage patches,
    `scale = 2**s`)."""

    layer: int                   # the block counted over all stages (the trace's index)
    stage: int
    block: int                   # within the stage
    grid: tuple[int, int]        # (Hs, Ws) the stage's token grid
    patch_grid: tuple[int, int]  # (H0, W0) the first stage's grid, where `patch` was chosen
    padded: tuple[int, int]      # the grid padded to whole windows
    token: tuple[int, int]       # (r, c) of the patch's token on the stage grid
    scale: int                   # first-stage patches per token side
    window: int                  # w
    shift: int                   # this block's shift (0 for even blocks)
    members: np.ndarray          # (Hs, Ws) bool: the tokens the patch's token attends to
    bias: np.ndarray             # (h, Hs, Ws) the bias row, NaN outside the window
    attn: np.ndarray             # (h, Hs, Ws) the attention row (first image), NaN outside the window
    outside: np.ndarray          # (h,) attention the token puts on padding tokens (not on the grid)
    table: np.ndarray            # (h, 2w-1, 2w-1) bias per offset (dy, dx): Swin's table, Swin-V2's raw CPB
    row_lines: tuple[int, ...]   # window boundaries between rows y-1 and y, on the stage grid
    col_lines: tuple[int, ...]
    what: str                    # what the bias is, for titles

    def shown(self, kind: str = "bias", head: int | None = None) -> np.ndarray:
        """`(Hs, Ws)`: the `kind` ("bias" / "attn") row at `head`, or the mean over the stage's heads
        (NaN outside the window)."""
        if kind not in ("bias", "attn"):
            raise ValueError(f"unknown row {kind!r}; valid: bias, attn")
        rows = self.bias if kind == "bias" else self.attn                       # (h, Hs, Ws)
        if head is None:
            return rows.mean(0)
        if not 0 <= head < rows.shape[0]:
            raise ValueError(f"head {head} out of range: stage {self.stage} has {rows.shape[0]} heads")
        return rows[head]

    def on_patch_grid(self, m: np.ndarray) -> np.ndarray:
        """A stage-grid map `(Hs, Ws)` spread over the first stage's patch grid `(H0, W0)` (each
        token's value on the `scale x scale` patches it covers), to draw with the ViT pages' overlay."""
        s = self.scale
        return np.repeat(np.repeat(m, s, axis=-2), s, axis=-1)[..., :self.patch_grid[0], :self.patch_grid[1]]

    @property
    def window_box(self) -> tuple[int, int, int, int]:
        """(r0, c0, r1, c1), end exclusive: the rectangle of `members` on the stage grid."""
        rows, cols = np.nonzero(self.members)
        return int(rows.min()), int(cols.min()), int(rows.max()) + 1, int(cols.max()) + 1


def window_lines(grid: tuple[int, int], window: int, shift: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The window boundaries of a block on a `grid` token grid: lines at `shift + k·window` strictly
    inside the grid (a line at y lies between rows y-1 and y), rows then columns. With a shift the
    windows that wrap around are cut by the mask, so the grid's edges bound them too."""
    def along(n: int) -> tuple[int, ...]:
        return tuple(y for y in range(shift % window, n, window) if 0 < y < n)
    return along(grid[0]), along(grid[1])


def stage_token(patch: tuple[int, int], stage: int, grid0: tuple[int, int]) -> tuple[int, int]:
    """The stage-`stage` token that covers first-stage patch `patch` (each merging pairs rows and
    columns 2i, 2i+1)."""
    r, c = patch
    if not (0 <= r < grid0[0] and 0 <= c < grid0[1]):
        raise ValueError(f"patch {patch} is outside the {grid0[0]}x{grid0[1]} patch grid")
    return r >> stage, c >> stage


def trace_of(model: SwinTransformer, image: torch.Tensor) -> list[dict]:
    """`model`'s trace of one image `(C, H, W)` or `(1, C, H, W)`."""
    import torch

    x = image if image.ndim == 4 else image[None]
    trace: list[dict] = []
    with torch.no_grad():
        model(x.to(next(model.parameters())), trace=trace)
    return trace


def window_rows(model: SwinTransformer, image: torch.Tensor | None, patch: tuple[int, int], layer: int, *,
                trace: list[dict] | None = None) -> WindowRows:
    """The bias and attention rows of first-stage patch `patch` = (row, col) at block `layer`
    (counted over all stages, `cfg.block_of`), over the window its token sits in, placed on the
    stage's grid. `trace` (from `trace_of` / `model(x, trace=[])`) spares the forward pass when
    given; otherwise `image` is traced."""
    cfg = model.cfg
    stage, block = cfg.block_of(layer)
    if trace is None:
        if image is None:
            raise ValueError("give an image or its trace")
        trace = trace_of(model, image)
    if len(trace) != cfg.depth:
        raise ValueError(f"the trace has {len(trace)} blocks; this model has {cfg.depth}")
    t = trace[layer]
    Hs, Ws = t["grid"]
    Hp, Wp = t["padded"]
    w, shift = t["window"], t["shift"]
    grid0 = trace[0]["grid"]
    r, c = stage_token(patch, stage, grid0)
    rr, cc = (r - shift) % Hp, (c - shift) % Wp                        # in the rolled, padded grid
    win = (rr // w) * (Wp // w) + cc // w
    n = (rr % w) * w + cc % w
    m = np.arange(w * w)
    ys = ((rr // w) * w + m // w + shift) % Hp                          # (N,) the window's tokens, unrolled
    xs = ((cc // w) * w + m % w + shift) % Wp
    keep = (ys < Hs) & (xs < Ws)
    if t["mask"] is not None:
        keep &= t["mask"][win, n].cpu().numpy() == 0
    bias = t["bias"][:, n].detach().float().cpu().numpy()               # (h, N)
    attn = t["attn"][0, win, :, n].detach().float().cpu().numpy()       # (h, N)
    h = bias.shape[0]
    bias_map = np.full((h, Hs, Ws), np.nan, dtype=np.float32)
    attn_map = np.full((h, Hs, Ws), np.nan, dtype=np.float32)
    bias_map[:, ys[keep], xs[keep]] = bias[:, keep]
    attn_map[:, ys[keep], xs[keep]] = attn[:, keep]
    members = np.zeros((Hs, Ws), dtype=bool)
    members[ys[keep], xs[keep]] = True
    rows, cols = window_lines((Hs, Ws), w, shift)
    what = "relative position bias (table)" if cfg.version == 1 else "continuous position bias 16·σ(CPB)"
    return WindowRows(layer=layer, stage=stage, block=block, grid=(Hs, Ws), patch_grid=grid0, padded=(Hp, Wp),
                      token=(r, c),
                      scale=2 ** stage, window=w, shift=shift, members=members, bias=bias_map, attn=attn_map,
                      outside=1.0 - attn[:, keep].sum(1), table=t["table"].detach().float().cpu().numpy(),
                      row_lines=rows, col_lines=cols, what=what)
