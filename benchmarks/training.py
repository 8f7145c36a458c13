"""Section 2 of the benchmark: whole-model training throughput.

Forward + backward + AdamW step (train.py's step), batch 128, compact preset, per encoding vs
`none` and `ape`, for the shipped compositions in `EXTRA_TRAIN`, and for a reference ViT of the
same size built from plain `torch.nn` (`TorchViT`; timm's VisionTransformer too, when
`import timm` works).
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.timing import Plan, interleaved, ratios
from vitpe_core.config import ViTConfig, preset_config
from vitpe_core.model import build_model

log = logging.getLogger(__name__)

TRAIN_BATCH = 128
EXTRA_TRAIN = ("sape2+ape", "cope+ape")        # shipped compositions, also timed whole-model


class TorchViT(nn.Module):
    """Reference ViT from plain `torch.nn` at a vitpe config: conv patch embed, CLS token,
    learned position table, `nn.TransformerEncoder` (pre-norm, GELU, batch-first, no
    dropout), final norm, linear head on CLS."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        H, W = cfg.grid
        self.patch_embed = nn.Conv2d(cfg.in_chans, cfg.dim, cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + H * W, cfg.dim) * 0.02)
        layer = nn.TransformerEncoderLayer(cfg.dim, cfg.heads, cfg.mlp_dim, dropout=0.0, activation="gelu",
                                           layer_norm_eps=cfg.norm_eps, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)                       # (B, N, D)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)     # (B, T, D)
        return self.head(self.norm(self.encoder(x + self.pos_embed))[:, 0])      # (B, classes)


def reference_models(cfg: ViTConfig) -> dict[str, Callable[[], nn.Module]]:
    """The plain-torch reference, and timm's VisionTransformer when timm is importable."""
    out: dict[str, Callable[[], nn.Module]] = {"torch.nn ViT (reference)": lambda: TorchViT(cfg)}
    try:
        from timm.models.vision_transformer import VisionTransformer
    except ImportError:
        return out
    out["timm VisionTransformer (reference)"] = lambda: VisionTransformer(
        img_size=cfg.img_size, patch_size=cfg.patch_size, embed_dim=cfg.dim, depth=cfg.depth, num_heads=cfg.heads,
        mlp_ratio=cfg.mlp_dim / cfg.dim, num_classes=cfg.num_classes, qkv_bias=cfg.qkv_bias)
    return out


def train_step(model: nn.Module, batch: int = TRAIN_BATCH) -> Callable[[], None]:
    """One training step as train.py does it on its normalised batch: label-smoothed cross
    entropy, backward, grad-norm clip 1.0, AdamW with train.py's parameter groups."""
    from vitpe_core.train import TrainConfig, _optimizer

    torch.manual_seed(0)
    model.train()
    opt = _optimizer(model, TrainConfig())
    x = torch.randn(batch, 3, 32, 32)                                           # (B, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return step


def bench_training(plan: Plan, encodings: list[str]) -> list[dict]:
    """One row per variant: images/s, ms per step and the throughput ratios vs `none` and `ape`."""
    cfg = preset_config("compact")
    builders: dict[str, Callable[[], nn.Module]] = {
        e: (lambda e=e: build_model(preset_config("compact", encoding=e))) for e in [*encodings, *EXTRA_TRAIN]}
    builders.update(reference_models(cfg))
    log.info("training throughput: %d variants, batch %d", len(builders), TRAIN_BATCH)
    fns = {}
    for name, build in builders.items():
        torch.manual_seed(0)
        fns[name] = train_step(build())
    s = interleaved(fns, rounds=plan.train_rounds, warmup=plan.warmup, calls_per_sample=plan.train_steps_per_sample)
    rows = []
    for name in builders:
        rows.append({"variant": name, "images_per_s": TRAIN_BATCH / float(np.median(s[name])),
                     "median_step_ms": 1e3 * float(np.median(s[name])), "min_step_ms": 1e3 * min(s[name]),
                     **ratios(s, name, "none", "throughput_vs_none", invert=True),
                     **ratios(s, name, "ape", "throughput_vs_ape", invert=True),
                     "samples_ms": [1e3 * t for t in s[name]]})
    return rows
