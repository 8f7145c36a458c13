"""Swin Transformer (arXiv 2103.14030) and Swin-V2 (arXiv 2111.09883), as Hugging Face
`transformers` computes them (`SwinForImageClassification`, `Swinv2ForImageClassification`).

Hierarchical: a patch embedding (+ LayerNorm), then stages of blocks that attend inside
non-overlapping `w x w` windows of the token grid (every odd block's windows shifted by `w // 2`,
by a cyclic roll and a mask of -100 between tokens from different regions), with patch merging
(2 x 2 neighbours concatenated, halving the grid) between stages; a final LayerNorm, the mean of
the tokens and a linear head.

* Swin: pre-norm blocks; scaled dot-product attention plus a learned relative position bias
  table per block, `((2w-1)^2, h)`, indexed by the offset between two tokens of a window.
* Swin-V2: res-post-norm blocks (`x + norm(attn(x))`); cosine attention times a learned,
  clamped logit scale `exp(min(s, log 100))`; the bias is `16 sigmoid(MLP(offset))`, a two-layer
  MLP (the continuous position bias, CPB) on log-spaced offsets
  `sign(t) log2(1 + 8|t| / (w'-1)) / 3` (`w'` the pretrained window, else the window itself);
  the key has no bias; patch merging reduces, then normalises.

Checked against transformers 5 (tests/test_swin.py): logits and every block's attention weights
within 1e-5 (relative) in float32. Deliberate deviations:
* Hugging Face's Swin-V2 adds the shift mask twice (-200 between regions); so does this model,
  to match it (the original adds it once: both give weights below 1e-43 there).
* Swin on a grid smaller than its table's window (another image size): the window shrinks to the
  grid as in Hugging Face, whose own forward then fails on the table's size; here the table's
  central `(2w-1)^2` offsets are used (the same offsets, a smaller window).
* Hugging Face's Swin keeps a window it shrank for a small input at every later, larger input
  (`SwinLayer.set_shift_and_window_size` overwrites the layer's window and shift); this model
  decides at every call, as a freshly loaded Hugging Face model does at that size.
* Swin's absolute table at another grid is resampled as `interpolate_pos_encoding=True` does
  (bicubic, align_corners=False, not antialiased); Hugging Face's can do so only for a table
  trained on a square grid.

`forward(images, trace=[])` records one dict per block, in order (see `WindowAttention`).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..encodings.absolute import resample_abs_pos_embed
from .config import SwinConfig

MASK_VALUE = -100.0      # Hugging Face's (and the original's) value between tokens of different regions
CPB_HIDDEN = 512


@functools.lru_cache(maxsize=32)
def relative_index(w: int) -> Tensor:
    """`(N, N)` index into a `(2w-1)^2` offset table: token i (row-major in the window) to j."""
    coords = torch.stack(torch.meshgrid(torch.arange(w), torch.arange(w), indexing="ij")).flatten(1)  # (2, N)
    rel = coords[:, :, None] - coords[:, None, :] + (w - 1)                                         # (2, N, N)
    return rel[0] * (2 * w - 1) + rel[1]                                                             # (N, N)


def cpb_coords(w: int, pretrained: int = 0) -> Tensor:
    """Swin-V2's log-spaced offsets `(2w-1, 2w-1, 2)` (dy, dx), as Hugging Face builds them."""
    r = torch.arange(-(w - 1), w, dtype=torch.int64).float()                                         # (2w-1,)
    table = torch.stack(torch.meshgrid([r, r], indexing="ij")).permute(1, 2, 0).contiguous()         # (2w-1, 2w-1, 2)
    if pretrained > 0:
        table /= pretrained - 1
    elif w > 1:
        table /= w - 1
    table *= 8
    return torch.sign(table) * torch.log2(torch.abs(table) + 1.0) / math.log2(8)


def shift_mask(padded: tuple[int, int], w: int, shift: int, device=None) -> Tensor | None:
    """`(nW, N, N)`: 0 between tokens of one region of the rolled grid, -100 otherwise; None
    without a shift. Regions per axis: `[0, L-w)`, `[L-w, L-shift)`, `[L-shift, L)`."""
    if shift <= 0:
        return None
    H, W = padded
    h, x = torch.arange(H, device=device), torch.arange(W, device=device)
    hr = (h >= H - w).long() + (h >= H - shift).long()                                               # (H,)
    wr = (x >= W - w).long() + (x >= W - shift).long()                                               # (W,)
    region = (hr[:, None] * 3 + wr[None, :]).float()                                                 # (H, W)
    win = rearrange(region, "(y a) (x b) -> (y x) (a b)", a=w, b=w)                                  # (nW, N)
    diff = win[:, None, :] - win[:, :, None]                                                         # (nW, N, N)
    return torch.where(diff != 0, MASK_VALUE, 0.0)


class WindowAttention(nn.Module):
    """Multi-head attention inside windows with Swin's relative bias (version 1) or Swin-V2's
    cosine attention and CPB (version 2). `trace` (a dict) receives `bias (h, N, N)` (the table
    looked up, or `16 sigmoid(CPB)`), `table (h, 2w-1, 2w-1)` (the learned table / the raw CPB
    output per offset), `logit_scale (h,)` (V2) and `attn (B·nW, h, N, N)`."""

    def __init__(self, dim: int, heads: int, window: int, version: int, qkv_bias: bool, pretrained_window: int = 0):
        super().__init__()
        self.heads, self.window, self.version, self.pretrained_window = heads, window, version, pretrained_window
        self.scale = (dim // heads) ** -0.5
        if version == 1:
            self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window - 1) ** 2, heads))
        else:   # the key has no bias (Swin-V2): q_bias, zeros, v_bias
            self.qkv = nn.Linear(dim, 3 * dim, bias=False)
            if qkv_bias:
                self.q_bias = nn.Parameter(torch.zeros(dim))
                self.v_bias = nn.Parameter(torch.zeros(dim))
            self.logit_scale = nn.Parameter(torch.full((heads, 1, 1), math.log(10.0)))
            self.cpb_mlp = nn.Sequential(nn.Linear(2, CPB_HIDDEN), nn.ReLU(inplace=True),
                                         nn.Linear(CPB_HIDDEN, heads, bias=False))
        self.proj = nn.Linear(dim, dim)

    def offset_table(self, w: int) -> Tensor:
        """`(h, 2w-1, 2w-1)`: the bias per offset (dy, dx) for window `w` before the lookup (V1: the
        learned table, its centre for a smaller window; V2: the CPB MLP's raw output)."""
        if self.version == 2:
            coords = cpb_coords(w, self.pretrained_window).to(self.cpb_mlp[0].weight)                 # (2w-1, 2w-1, 2)
            return rearrange(self.cpb_mlp(coords), "y x h -> h y x")
        t = self.window
        if w > t:
            raise ValueError(f"a window of {w} needs offsets beyond this block's table ({t}x{t} windows): "
                             "use an image no larger than the model's")
        table = rearrange(self.relative_position_bias_table, "(y x) h -> h y x", y=2 * t - 1)        # (h, 2t-1, 2t-1)
        return table[:, t - w: t + w - 1, t - w: t + w - 1]

    def bias(self, w: int) -> tuple[Tensor, Tensor]:
        """(`(h, N, N)` bias added to the logits, `(h, 2w-1, 2w-1)` offset table)."""
        table = self.offset_table(w)                                                                  # (h, 2w-1, 2w-1)
        idx = relative_index(w).to(table.device)                                                      # (N, N)
        bias = table.flatten(1)[:, idx]                                                               # (h, N, N)
        return (16 * torch.sigmoid(bias) if self.version == 2 else bias), table

    def forward(self, x: Tensor, w: int, mask: Tensor | None, trace: dict | None = None) -> Tensor:
        """`x (B·nW, N, C)` windows in the order of `window_partition`; `mask (nW, N, N)` or None."""
        if self.version == 2 and hasattr(self, "q_bias"):
            qkv_bias = torch.cat((self.q_bias, torch.zeros_like(self.v_bias), self.v_bias))
            qkv = F.linear(x, self.qkv.weight, qkv_bias)
        else:
            qkv = self.qkv(x)
        q, k, v = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=self.heads).unbind(0)  # (B·nW, h, N, d)
        bias, table = self.bias(w)                                                                    # (h, N, N)
        if self.version == 1:   # transformers: logits + (bias + mask), the mask tiled over the batch
            logits = (q @ k.transpose(-1, -2)) * self.scale                                           # (B·nW, h, N, N)
            if mask is not None:
                mask = mask[:, None].repeat(x.shape[0] // mask.shape[0], 1, 1, 1)                     # (B·nW, 1, N, N)
            logits = logits + (bias[None] if mask is None else bias[None] + mask)
        else:
            logits = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)              # (B·nW, h, N, N)
            scale = torch.clamp(self.logit_scale, max=math.log(1.0 / 0.01)).exp()                    # (h, 1, 1)
            logits = logits * scale + bias[None]
            if mask is not None:   # Hugging Face's Swin-V2 adds the mask twice
                nW = mask.shape[0]
                logits = rearrange(logits, "(b w) h n m -> b w h n m", w=nW) + mask[None, :, None]
                logits = rearrange(logits + mask[None, :, None], "b w h n m -> (b w) h n m")
        attn = logits.softmax(dim=-1)                                                                 # (B·nW, h, N, N)
        if trace is not None:
            trace.update(bias=bias, table=table, attn=attn)
            if self.version == 2:
                trace["logit_scale"] = scale.flatten()
        out = rearrange(attn @ v, "b h n d -> b n (h d)")                                             # (B·nW, N, C)
        return self.proj(out)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwinBlock(nn.Module):
    """One (shifted-)window block: Swin pre-norm `x + attn(norm1(x))`, `x + mlp(norm2(x))`;
    Swin-V2 res-post-norm `x + norm1(attn(x))`, `x + norm2(mlp(x))`."""

    def __init__(self, cfg: SwinConfig, stage: int, index: int) -> None:
        super().__init__()
        dim, heads = cfg.stage_dim(stage), cfg.num_heads[stage]
        self.cfg, self.stage, self.index = cfg, stage, index
        self.norm1 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.attn = WindowAttention(dim, heads, cfg.stage_windows[stage], cfg.version, cfg.qkv_bias,
                                    cfg.pretrained_window(stage))
        self.norm2 = nn.LayerNorm(dim, eps=cfg.norm_eps)
        self.mlp = Mlp(dim, cfg.mlp_dim(stage))

    def window_attention(self, x: Tensor, grid: tuple[int, int], trace: list[dict] | None) -> Tensor:
        """`x (B, H·W, C)` -> attention output `(B, H·W, C)`: pad to whole windows, roll, attend per
        window, roll back, crop."""
        H, W = grid
        w, shift = self.cfg.layout(self.stage, grid)
        shift = shift if self.index % 2 else 0
        x = rearrange(x, "b (y x) c -> b y x c", y=H)                                                 # (B, H, W, C)
        x = F.pad(x, (0, 0, 0, (w - W % w) % w, 0, (w - H % w) % w))                                  # (B, Hp, Wp, C)
        Hp, Wp = x.shape[1:3]
        if shift:
            x = torch.roll(x, shifts=(-shift, -shift), dims=(1, 2))
        windows = rearrange(x, "b (y a) (x c) d -> (b y x) (a c) d", a=w, c=w)                      # (B·nW, N, C)
        mask = shift_mask((Hp, Wp), w, shift, x.device)                                                # (nW, N, N)
        entry = None
        if trace is not None:
            entry = {"stage": self.stage, "block": self.index, "grid": (H, W), "padded": (Hp, Wp),
                     "window": w, "shift": shift, "mask": mask}
        out = self.attn(windows, w, None if mask is None else mask.to(windows.dtype), entry)          # (B·nW, N, C)
        out = rearrange(out, "(b y x) (a c) d -> b (y a) (x c) d", y=Hp // w, x=Wp // w, a=w)        # (B, Hp, Wp, C)
        if shift:
            out = torch.roll(out, shifts=(shift, shift), dims=(1, 2))
        if entry is not None:
            entry["attn"] = rearrange(entry["attn"], "(b n) h i j -> b n h i j", n=Hp // w * (Wp // w))
            trace.append(entry)
        return rearrange(out[:, :H, :W], "b y x c -> b (y x) c")                                      # (B, H·W, C)

    def forward(self, x: Tensor, grid: tuple[int, int], trace: list[dict] | None = None) -> Tensor:
        if self.cfg.version == 1:
            x = x + self.window_attention(self.norm1(x), grid, trace)
            return x + self.mlp(self.norm2(x))
        x = x + self.norm1(self.window_attention(x, grid, trace))
        return x + self.norm2(self.mlp(x))


class PatchMerging(nn.Module):
    """2 x 2 neighbours -> one token of twice the width (odd grids padded by one row / column):
    Swin normalises then reduces, Swin-V2 reduces then normalises."""

    def __init__(self, dim: int, version: int) -> None:
        super().__init__()
        self.version = version
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(4 * dim if version == 1 else 2 * dim)   # eps 1e-5, as Hugging Face's

    def forward(self, x: Tensor, grid: tuple[int, int]) -> tuple[Tensor, tuple[int, int]]:
        H, W = grid
        x = rearrange(x, "b (y x) c -> b y x c", y=H)                                                 # (B, H, W, C)
        x = F.pad(x, (0, 0, 0, W % 2, 0, H % 2))                                                      # (B, H', W', C)
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)  # (B, H/2, W/2, 4C)
        grid = x.shape[1:3]
        x = rearrange(x, "b y x c -> b (y x) c")
        x = self.reduction(self.norm(x)) if self.version == 1 else self.norm(self.reduction(x))     # (B, N/4, 2C)
        return x, (int(grid[0]), int(grid[1]))


class SwinStage(nn.Module):
    def __init__(self, cfg: SwinConfig, stage: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(SwinBlock(cfg, stage, i) for i in range(cfg.depths[stage]))
        self.downsample = PatchMerging(cfg.stage_dim(stage), cfg.version) if stage < cfg.stages - 1 else None


class SwinTransformer(nn.Module):
    """`forward(images (B, C, H_img, W_img)) -> logits (B, num_classes)` (or the pooled features
    `(B, C_last)` without a head); `trace=[]` receives one dict per block, stage by stage:
    `stage`, `block` (within the stage), `grid` (the stage's token grid), `padded` (to whole
    windows), `window`, `shift`, `mask (nW, N, N)` (None without shift), `bias (h, N, N)`,
    `table (h, 2w-1, 2w-1)`, `attn (B, nW, h, N, N)` and for Swin-V2 `logit_scale (h,)`. Windows
    are numbered row-major over the padded, rolled grid; tokens row-major inside a window."""

    def __init__(self, cfg: SwinConfig, init_weights: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, cfg.patch_size, stride=cfg.patch_size)
        self.patch_embed.norm = nn.LayerNorm(cfg.embed_dim)                   # eps 1e-5, as Hugging Face's
        if cfg.absolute_pos_embed:
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, cfg.grid[0] * cfg.grid[1], cfg.embed_dim))
        self.layers = nn.ModuleList(SwinStage(cfg, s) for s in range(cfg.stages))
        self.norm = nn.LayerNorm(cfg.num_features, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.num_features, cfg.num_classes) if cfg.num_classes else nn.Identity()
        if init_weights:
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.trunc_normal_(m.weight, std=0.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)

    def grid_for(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """First-stage grid of an image (padded to whole patches, as Hugging Face does)."""
        p = self.cfg.patch_size
        return (-(-img_size[0] // p), -(-img_size[1] // p))

    def embed(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        p = self.cfg.patch_size
        x = F.pad(x, (0, (p - x.shape[-1] % p) % p, 0, (p - x.shape[-2] % p) % p))                  # whole patches
        x = self.patch_embed.proj(x)                                                                  # (B, C, H, W)
        grid = (x.shape[-2], x.shape[-1])
        x = self.patch_embed.norm(rearrange(x, "b c y x -> b (y x) c"))                              # (B, N, C)
        if self.cfg.absolute_pos_embed:   # resampled at another grid as transformers' interpolate_pos_encoding
            x = x + resample_abs_pos_embed(self.absolute_pos_embed, grid, self.cfg.grid, 0, antialias=False)
        return x, grid

    def forward_features(self, x: Tensor, trace: list[dict] | None = None) -> Tensor:
        """`(B, C, H_img, W_img)` -> the final normalised tokens `(B, N_last, C_last)`."""
        x, grid = self.embed(x)
        for stage in self.layers:
            for blk in stage.blocks:
                x = blk(x, grid, trace)
            if stage.downsample is not None:
                x, grid = stage.downsample(x, grid)
        return self.norm(x)

    def prefix_names(self) -> list[str]:
        """No class or register tokens: every token is a patch (as `ViT.prefix_names`)."""
        return []

    def forward(self, x: Tensor, trace: list[dict] | None = None) -> Tensor:
        return self.head(self.forward_features(x, trace).mean(1))                                    # (B, classes)
