"""A Vision Transformer with one pluggable position encoding.

Shared parts use timm's `VisionTransformer` parameter names (`cls_token`, `patch_embed.proj`,
`blocks.{i}.norm1/attn.qkv/attn.proj/norm2/mlp.fc1/mlp.fc2`, `norm`, `head`), and `ape`
keeps timm's `pos_embed` layout, so a timm / DeiT state dict with a learned table loads
into `encoding="ape"` with `model.load_state_dict(sd)` (the key `pos_embed` is mapped).

One attention class with two paths:
* fast: the encoding's own fused attention when it has one (`attend`: CoPE, SaPE², see
  vitpe_core/encodings/functional.py), else `F.scaled_dot_product_attention` with the
  encoding's bias passed as `attn_mask` (an explicit softmax over logits computed once for
  other encodings that reuse the logits);
* trace: explicit softmax, recording per layer the bias, its named parts and the weights.
tests/test_encodings.py (`test_contract_shapes_finite_gradients_and_fast_equals_trace`) checks
that both give the same logits for every registered encoding and several compositions.
The grid is taken from the input size, so a model runs at other resolutions; each
encoding resizes or recomputes itself as docs/encodings.md says.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .config import ViTConfig
from .encodings import EncodingContext, PositionEncoding, build_encoding
from .encodings.base import Grid
from .encodings.functional import fused_under_compile


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, pos: PositionEncoding, grid: Grid, layer: int,
                trace: list[dict] | None = None) -> Tensor:
        qkv = rearrange(self.qkv(x), "b t (three h d) -> three b h t d", three=3, h=self.heads)
        q, k, v = qkv.unbind(0)                                      # (B, h, T, d) each
        # CoPE / SaPE²: bias, softmax and @ v fused, logits formed once. Under torch.compile only
        # where the C++ kernel runs (as custom ops, encodings/compiled_ops.py); else the bias path.
        if trace is None and (not torch.compiler.is_compiling() or fused_under_compile(q)):
            out = pos.attend(q, k, v, grid=grid, layer=layer, scale=self.scale, qkv=qkv)
            if out is not None:
                return self.proj(rearrange(out, "b h t d -> b t (h d)"))  # (B, T, D)
        parts: dict[str, Tensor] | None = {} if trace is not None else None
        # gates of CoPE / SaPE² are σ of these very logits: compute them once (not after a rotation)
        shared = pos.uses_logits and "rotation" not in pos.hooks
        logits = (q * self.scale) @ k.transpose(-1, -2) if shared else None  # (B, h, T, T)
        bias = pos.bias(q, k, grid=grid, layer=layer, parts=parts, logits=logits)  # (B|1, h, T, T) or None
        q, k = pos.rotate(q, k, grid=grid, layer=layer)
        if trace is None and logits is None:
            mask = None if bias is None else bias.to(q.dtype)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, h, T, d)
        else:  # explicit softmax: what SDPA does on CPU with a float mask anyway
            if logits is None:
                logits = (q * self.scale) @ k.transpose(-1, -2)      # (B, h, T, T)
            if bias is not None:
                logits = logits + bias.to(logits.dtype)
            attn = logits.softmax(dim=-1)                            # (B, h, T, T)
            out = attn @ v                                           # (B, h, T, d)
            if trace is not None:
                trace.append({"attn": attn, "bias": bias, "parts": parts, "q": q, "k": k})
        return self.proj(rearrange(out, "b h t d -> b t (h d)"))    # (B, T, D)


class QuickGELU(nn.Module):
    """`x·σ(1.702x)`: CLIP's activation (transformers' `quick_gelu`)."""

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.sigmoid(1.702 * x)


def activation(name: str) -> nn.Module:
    """The module of `ViTConfig.act`."""
    return {"gelu": nn.GELU, "gelu_tanh": lambda: nn.GELU(approximate="tanh"), "quick_gelu": QuickGELU,
            "silu": nn.SiLU}[name]()


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, act: str = "gelu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = activation(act)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class GatedMlp(nn.Module):
    """`fc2(act(fc1_g x) · fc1_x x)`: SwiGLU with `act="silu"` (timm's names; DINOv2-g, DINOv3's gated MLPs)."""

    def __init__(self, dim: int, hidden: int, act: str = "silu") -> None:
        super().__init__()
        self.fc1_g = nn.Linear(dim, hidden)
        self.fc1_x = nn.Linear(dim, hidden)
        self.act = activation(act)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1_g(x)) * self.fc1_x(x))


class AttentionPool(nn.Module):
    """Multi-head attention pooling (MAP): one learned query `latent` attends over all tokens,
    then a residual MLP on its LayerNorm; timm's `AttentionPoolLatent` names, SigLIP's `head`.
    `(B, T, D) -> (B, D)`."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.latent = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.q = nn.Linear(cfg.dim, cfg.dim)
        self.kv = nn.Linear(cfg.dim, 2 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = Mlp(cfg.dim, cfg.mlp_dim, cfg.act)

    def forward(self, x: Tensor) -> Tensor:
        q = rearrange(self.q(self.latent), "one t (h d) -> one h t d", h=self.heads)          # (1, h, 1, d)
        k, v = rearrange(self.kv(x), "b t (two h d) -> two b h t d", two=2, h=self.heads)    # (B, h, T, d) each
        out = F.scaled_dot_product_attention(q.expand(x.shape[0], -1, -1, -1), k, v)        # (B, h, 1, d)
        out = self.proj(rearrange(out, "b h t d -> b t (h d)"))                              # (B, 1, D)
        return (out + self.mlp(self.norm(out)))[:, 0]                                        # (B, D)


def drop_path(x: Tensor, p: float, training: bool) -> Tensor:
    if p == 0.0 or not training:
        return x
    keep = x.new_empty(x.shape[0], *([1] * (x.ndim - 1))).bernoulli_(1 - p)
    return x * keep / (1 - p)


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (CaiT / DeiT-III; timm's `ls1.gamma`)."""

    def __init__(self, dim: int, init: float = 1e-5) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), init))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block (with LayerScale when `cfg.layer_scale`)."""

    def __init__(self, cfg: ViTConfig, drop_path: float = 0.0) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = Attention(cfg.dim, cfg.heads, cfg.qkv_bias)
        self.ls1 = LayerScale(cfg.dim) if cfg.layer_scale else nn.Identity()
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = (GatedMlp if cfg.mlp == "gated" else Mlp)(cfg.dim, cfg.mlp_dim, cfg.act)
        self.ls2 = LayerScale(cfg.dim) if cfg.layer_scale else nn.Identity()
        self.drop_path = drop_path

    def forward(self, x, pos, grid, layer, trace=None):
        x = x + drop_path(self.ls1(self.attn(self.norm1(x), pos, grid, layer, trace)), self.drop_path, self.training)
        return x + drop_path(self.ls2(self.mlp(self.norm2(x))), self.drop_path, self.training)


class ViT(nn.Module):
    """`forward(images (B, C, H_img, W_img)) -> logits (B, num_classes)`; pass `trace=[]` to
    record per-layer attention, bias and bias parts (see Attention).

    Tokens are `P` prefix tokens (CLS, distillation, registers, as the config has them) then
    the `N` patches, row-major. The read-out is the CLS token (`pool="token"`), the mean of
    the patch tokens (`"avg"`, then `fc_norm`), both concatenated (`"token+avg"`, DINOv2's
    classifier) or attention pooling (`"map"`, SigLIP); with a distillation token its own head
    `head_dist` is averaged with `head` (timm's DeiT at eval). `pre_norm` adds a LayerNorm
    before the first block (CLIP); `final_norm=False` leaves out `norm` after the last one.
    `num_classes=0`: no head, the pooled features are returned (e.g. a DINOv2 backbone)."""

    def __init__(self, cfg: ViTConfig, init_weights: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_prefix = cfg.num_prefix
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(cfg.in_chans, cfg.dim, cfg.patch_size, stride=cfg.patch_size)
        if cfg.class_token:
            self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        if cfg.dist_token:
            self.dist_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        if cfg.reg_tokens:
            self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, cfg.dim))
        ctx = EncodingContext(cfg.dim, cfg.heads, cfg.depth, cfg.grid, self.num_prefix,
                              table_prefix=0 if cfg.no_embed_class else self.num_prefix)
        self.pos_enc = build_encoding(cfg.encoding, ctx, **cfg.encoding_options)
        rates = torch.linspace(0, cfg.drop_path, cfg.depth, device="cpu").tolist()
        self.blocks = nn.ModuleList(Block(cfg, r) for r in rates)
        if cfg.pre_norm:
            self.norm_pre = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps) if cfg.final_norm and not cfg.fc_norm else nn.Identity()
        if cfg.fc_norm:
            self.fc_norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        if cfg.pool == "map":
            self.attn_pool = AttentionPool(cfg)
        features = 2 * cfg.dim if cfg.pool == "token+avg" else cfg.dim
        self.head = nn.Linear(features, cfg.num_classes) if cfg.num_classes else nn.Identity()
        if cfg.dist_token:
            self.head_dist = nn.Linear(cfg.dim, cfg.num_classes) if cfg.num_classes else nn.Identity()
        if init_weights:   # off where every parameter is loaded next (checkpoint.load_checkpoint: 70 ms saved)
            self._init_weights()
        self.register_load_state_dict_pre_hook(_map_timm_keys)

    def prefix_names(self) -> list[str]:
        """A name per prefix token, in token order (for labels: "CLS", "dist", "reg 0", ...)."""
        return self.cfg.prefix_names()

    def _init_weights(self) -> None:
        for name in ("cls_token", "dist_token", "reg_token"):
            if hasattr(self, name):
                nn.init.normal_(getattr(self, name), std=1e-6)  # timm
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def grid_for(self, img_size: tuple[int, int]) -> Grid:
        p = self.cfg.patch_size
        if img_size[0] % p or img_size[1] % p:
            raise ValueError(f"image size {tuple(img_size)} is not a multiple of the patch size {p}")
        return (img_size[0] // p, img_size[1] // p)

    def tokens(self, x: Tensor) -> tuple[Tensor, Grid]:
        """Prefix + patch tokens with the absolute table added: `(B, T, D)` and the grid."""
        grid = self.grid_for(x.shape[-2:])
        x = rearrange(self.patch_embed.proj(x), "b d y x -> b (y x) d")        # (B, N, D)
        B = x.shape[0]
        prefix = [getattr(self, n).expand(B, -1, -1) for n in ("cls_token", "dist_token", "reg_token")
                  if hasattr(self, n)]
        x = torch.cat((*prefix, x), dim=1)                                     # (B, T, D)
        table = self.pos_enc.table(grid)                                       # (P'+N, D) or None
        if table is not None:   # a table without prefix rows (no_embed_class) leaves the prefix tokens alone
            T = x.shape[1]
            x = torch.cat((x[:, :T - table.shape[0]], x[:, T - table.shape[0]:] + table.to(x.dtype)), dim=1)
        return x, grid

    def forward_features(self, x: Tensor, trace: list[dict] | None = None) -> Tensor:
        x, grid = self.tokens(x)
        if self.cfg.pre_norm:
            x = self.norm_pre(x)
        for i, blk in enumerate(self.blocks):
            x = blk(x, self.pos_enc, grid, i, trace)
        return self.norm(x)                                                    # (B, T, D)

    def pool(self, x: Tensor) -> Tensor:
        """`(B, T, D)` normalised tokens -> `(B, D)` read-out features."""
        pool = self.cfg.pool
        if pool == "map":
            feat = self.attn_pool(x)
        elif pool == "avg":
            feat = x[:, self.num_prefix:].mean(1)
        elif pool == "token+avg":
            feat = torch.cat((x[:, 0], x[:, self.num_prefix:].mean(1)), dim=-1)                # (B, 2D)
        else:
            feat = x[:, 0]
        return self.fc_norm(feat) if self.cfg.fc_norm else feat

    def forward(self, x: Tensor, trace: list[dict] | None = None) -> Tensor:
        x = self.forward_features(x, trace)                                    # (B, T, D)
        out = self.head(self.pool(x))                                          # (B, classes)
        if self.cfg.dist_token:
            out = (out + self.head_dist(x[:, 1])) / 2
        return out


def map_timm_pos_embed(model: ViT, state_dict: dict, prefix: str = "") -> None:
    """Move timm's top-level `pos_embed` (in place) to the `ape` table wherever it sits in the
    encoding; nothing to do for other state dicts."""
    key = prefix + "pos_embed"
    if key in state_dict:
        targets = [n for n, _ in model.pos_enc.named_parameters() if n.split(".")[-1] == "pos_embed"]
        if len(targets) == 1:
            state_dict[prefix + "pos_enc." + targets[0]] = state_dict.pop(key)


def _map_timm_keys(module: ViT, state_dict: dict, prefix: str, *args) -> None:
    map_timm_pos_embed(module, state_dict, prefix)


def build_model(cfg: ViTConfig) -> ViT:
    return ViT(cfg)


def empty_model(cfg: ViTConfig) -> ViT:
    """A ViT to be filled with `load_state_dict(weights, assign=True)`: its parameters on the
    meta device (no memory, no initialisation), so that an importer never holds a big model
    twice (its own random parameters and the weights to load: 1.4 GB at once for a ViT-B/16 in
    float32, where 0.35 GB is the model). The position encoding is built on the CPU: it is small,
    and its computed buffers (sin-cos tables, RoPE frequencies) are in no state dict. Every
    parameter must then be assigned (`checkpoint.load_weights(..., assign=True)` checks it)."""
    with torch.device("meta"):
        model = ViT(cfg, init_weights=False)
    ctx = EncodingContext(cfg.dim, cfg.heads, cfg.depth, cfg.grid, model.num_prefix,
                          table_prefix=0 if cfg.no_embed_class else model.num_prefix)
    model.pos_enc = build_encoding(cfg.encoding, ctx, **cfg.encoding_options)
    return model
