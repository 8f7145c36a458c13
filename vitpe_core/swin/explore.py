"""What the app's pages show of a Swin / Swin-V2 model, as functions of its trace (no Streamlit,
no Plotly; like `vitpe_core.views` for the ViT pages).

* `is_swin_model(obj)`: whether a config, model or checkpoint is a Swin (`"arch": "swin"`).
* `SwinTrace` / `trace_image`: one image's forward pass as the app caches it: the logits (or the
  pooled features of a headless model) and every block's trace (`SwinTransformer.forward(...,
  trace=[])`), the attention in float16 when the trace is big (as `analysis.compact_trace`).
  `swin.windows.window_rows(model, None, patch, layer, trace=tr.blocks)` reads it.
* `stage_head`, `block_text`, `window_caption`: the head a stage has, and what the bias explorer
  says it shows (stage, block, shift, window).
* `offset_bias`, `window_attention_stats`: the block's bias per offset `(2w-1, 2w-1)`, its
  position-only kernel, and its attention's mean distance and entropy (the compare page).
* `pad_display`: the displayed image padded to what a stage's token grid covers (patch merging
  pads odd grids), so the windows drawn over it sit where the model put them.
* `config_text`, `no_table_text`: a Swin config in one line (the checkpoints table); what the
  similarity page says of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analysis import COMPACT_ABOVE
from .config import ARCH, SwinConfig
from .windows import WindowRows

if TYPE_CHECKING:   # torch is imported where it is used: the app draws its first page before torch is loaded
    import torch

    from .model import SwinTransformer

SKIPPED = ("Attention rollout and the stress test are not drawn for Swin: rollout multiplies one grid's token-to-"
           "token attention through the layers, and Swin's patch merging changes the grid at every stage.")
NO_TABLE = ("a Swin model has no absolute position table: its positions are a relative bias inside each window "
            "(drawn on the bias explorer)")
NO_TABLE_APE = ("a Swin's optional absolute table is not analysed here (this page reads a ViT's table, one row per "
                "patch of one grid); its relative bias inside each window is drawn on the bias explorer")


def no_table_text(cfg: SwinConfig) -> str:
    """What the similarity page says of a Swin: it has no absolute table (`NO_TABLE`), or its
    optional one (`absolute_pos_embed`) is not the ViT table the page reads."""
    return NO_TABLE_APE if cfg.absolute_pos_embed else NO_TABLE


def is_swin_model(obj: Any) -> bool:
    """Whether `obj` (a config, a model or a `Checkpoint`) is a Swin / Swin-V2."""
    cfg = getattr(obj, "config", None) or getattr(obj, "cfg", None) or obj
    return getattr(cfg, "arch", "vit") == ARCH


@dataclass(frozen=True)
class SwinTrace:
    """One image through a Swin: `logits (classes,)` (the pooled features without a head) and
    `blocks`, the model's trace (one dict per block, stage by stage; tensors on the CPU)."""

    logits: np.ndarray
    blocks: tuple[dict, ...]

    @property
    def probs(self) -> np.ndarray:
        z = self.logits.astype(np.float64)
        e = np.exp(z - z.max())
        return (e / e.sum()).astype(np.float32)

    @property
    def nbytes(self) -> int:
        import torch

        return sum(v.numel() * v.element_size() for t in self.blocks for v in t.values() if torch.is_tensor(v))


def trace_image(model: SwinTransformer, x: torch.Tensor, compact_above: int = COMPACT_ABOVE) -> SwinTrace:
    """The `SwinTrace` of one image `(C, H, W)` or `(1, C, H, W)`: a trace of more than
    `compact_above` bytes keeps its attention in float16 (window_rows reads it as float32)."""
    import torch

    x = x if x.ndim == 4 else x[None]
    if x.shape[0] != 1:
        raise ValueError(f"one image at a time, got a batch of {x.shape[0]}")
    blocks: list[dict] = []
    with torch.no_grad():
        logits = model(x.to(next(model.parameters())), trace=blocks)[0].float().cpu().numpy()
    blocks = [{k: v.detach().cpu().clone() if torch.is_tensor(v) else v for k, v in t.items()} for t in blocks]
    tr = SwinTrace(logits, tuple(blocks))
    if tr.nbytes > compact_above:
        for t in tr.blocks:
            t["attn"] = t["attn"].half()
    return tr


def stage_head(cfg: SwinConfig, layer: int, head: int | None) -> tuple[int | None, str]:
    """The head of block `layer`'s stage to show for the page's `head` (None: the mean), and a
    note when the stage has fewer heads than the picker offers (its last head is shown)."""
    stage, _ = cfg.block_of(layer)
    n = cfg.num_heads[stage]
    if head is None or head < n:
        return head, ""
    return n - 1, f" Stage {stage} has {n} heads: head {n - 1} is shown for head {head}."


def block_text(rows: WindowRows) -> str:
    """"block 3 (stage 1, block 1), shifted by 1": which block a view shows."""
    shift = f"shifted by {rows.shift}" if rows.shift else "not shifted"
    return f"block {rows.layer} (stage {rows.stage}, block {rows.block}), {shift}"


def window_caption(rows: WindowRows, patch: tuple[int, int]) -> str:
    """What the bias explorer's maps show for a Swin, in a sentence or three."""
    r0, c0, r1, c1 = rows.window_box
    n = rows.scale
    token = "its own token" if n == 1 else \
        f"in the stage-{rows.stage} token ({rows.token[0]}, {rows.token[1]}), which covers {n}×{n} patches"
    return (f"Swin {block_text(rows)}: windows of {rows.window}×{rows.window} tokens on the stage's "
            f"{rows.grid[0]}×{rows.grid[1]} grid (lines; {'rolled by the shift, ' if rows.shift else ''}the "
            f"dashed box is the patch's window, rows {r0}–{r1 - 1}, columns {c0}–{c1 - 1}). Patch ({patch[0]}, "
            f"{patch[1]}) is {token}. A Swin patch attends only inside its window: outside it there is no bias "
            f"and no attention (blank). The bias is the {rows.what}, the same for every image.")


def offset_bias(rows: WindowRows, version: int, head: int | None) -> np.ndarray:
    """`(2w-1, 2w-1)`: the bias block `rows.layer` adds at each offset (dy, dx) = query − key
    (centre: the query itself): Swin's table, Swin-V2's `16·sigmoid(CPB)`; a head or the mean."""
    table = rows.table if version == 1 else 16 / (1 + np.exp(-rows.table.astype(np.float64)))
    table = table.astype(np.float32)
    return table.mean(0) if head is None else table[head]


def window_attention_stats(tr: SwinTrace, layer: int, head: int | None) -> dict[str, float]:
    """Block `layer`'s attention as the compare table states a ViT's: `mean_distance` (in
    first-stage patches: a stage-`s` token is `2**s` of them) and `entropy` (nats) of the
    attention rows of every query on the image grid (window padding left out), a head or the
    mean over the stage's heads."""
    t = tr.blocks[layer]
    w, s, scale = t["window"], t["shift"], 2 ** t["stage"]
    (Hs, Ws), (Hp, Wp) = t["grid"], t["padded"]
    a = t["attn"][0].float().numpy()                                              # (nW, h, N, N)
    a = a if head is None else a[:, head:head + 1]
    m = np.arange(w * w)
    dist = np.hypot(m[:, None] // w - m[None] // w, m[:, None] % w - m[None] % w) * scale            # (N, N)
    win = np.arange(a.shape[0])[:, None]
    ys = ((win // (Wp // w)) * w + m // w + s) % Hp                               # (nW, N) the queries, unrolled
    xs = ((win % (Wp // w)) * w + m % w + s) % Wp
    valid = (ys < Hs) & (xs < Ws)
    entropy = -(a * np.log(np.clip(a, 1e-30, None))).sum(-1)                     # (nW, h, N)
    mean = lambda v: float(v.mean(1)[valid].mean())
    return {"mean_distance": mean((a * dist).sum(-1)), "entropy": mean(entropy)}


def pad_display(display: np.ndarray, rows: WindowRows, img_size: tuple[int, int], patch_size: int) -> np.ndarray:
    """`display (h_px, w_px, 3)`, the model's `img_size` input as shown, padded (grey, bottom and
    right) to the pixels the stage's token grid covers: whole patches, then each patch merging's
    padding of an odd grid. The stage grid then maps onto the picture exactly."""
    h_px, w_px = display.shape[:2]
    need = [rows.grid[i] * rows.scale * patch_size for i in (0, 1)]              # model pixels
    pad = [max(0, round((need[i] - img_size[i]) * (h_px, w_px)[i] / img_size[i])) for i in (0, 1)]
    if not any(pad):
        return display
    return np.pad(display, ((0, pad[0]), (0, pad[1]), (0, 0)), constant_values=128)


def config_text(cfg: SwinConfig) -> str:
    """"Swin-V2 · C 96 · depths 2-2-6-2 · heads 3-6-12-24 · window 7 (per stage 7/7/7/7, shift
    3/3/3/0)" and an absolute table when it has one."""
    join = lambda v, sep="-": sep.join(map(str, v))
    return (f"{'Swin' if cfg.version == 1 else 'Swin-V2'} · C {cfg.embed_dim} · depths {join(cfg.depths)} · "
            f"heads {join(cfg.num_heads)} · window {cfg.window_size} (per stage {join(cfg.stage_windows, '/')}, "
            f"shift {join(cfg.stage_shifts, '/')}) · patch {cfg.patch_size}"
            + (" · absolute table" if cfg.absolute_pos_embed else ""))
