"""Frozen configurations serialised into every checkpoint.

`ViTConfig` describes a model completely (architecture + position encoding), so a
checkpoint rebuilds its model without outside knowledge. `PRESETS` holds the two recipes
the project trains: `compact` (the published compact-ViT comparison size) and `paper`
(ViT-S as in the SaPE² paper, arXiv 2505.09466).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any


POOLS = ("token", "avg", "token+avg", "map")   # CLS; mean of the patches; [CLS, mean] (DINOv2); attention pooling
ACTS = ("gelu", "gelu_tanh", "quick_gelu", "silu")   # exact GELU; tanh-approximated (SigLIP); x·σ(1.702x) (CLIP); SiLU
MLPS = ("mlp", "gated")                        # fc2(act(fc1 x)); fc2(act(fc1_g x) * fc1_x x) (SwiGLU with act="silu")


# The encodings' names, torch-free: a config is checked against them without importing the encodings (and torch),
# as the app's first page does. The built-in ones are listed here (tests/test_light_imports.py checks them against
# vitpe_core.encodings); `encodings.register_encoding` adds any other.
BUILT_IN_ENCODINGS = ("none", "ape", "ape2d", "sincos2d", "rpb", "rpb_cls", "rope_axial", "rope_mixed", "rope_dinov3",
                      "cope", "sape2")
ENCODINGS: list[str] = list(BUILT_IN_ENCODINGS)


def encoding_parts(name: str) -> list[str]:
    """The parts of encoding `name` (`a+b` composes); ValueError for an unknown part or one
    named twice."""
    parts = [p.strip() for p in name.split("+")]
    unknown = [p for p in parts if p not in ENCODINGS]
    if unknown or not parts:
        raise ValueError(f"unknown encoding {unknown or name!r}; valid: {sorted(ENCODINGS)}, "
                         "or several joined with '+', e.g. 'sape2+ape'")
    if len(set(parts)) != len(parts):
        raise ValueError(f"encoding {name!r} names a part twice")
    return parts


@dataclass(frozen=True)
class ViTConfig:
    img_size: tuple[int, int] = (32, 32)      # (height, width) in pixels the model is built for
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 10
    dim: int = 128                             # D
    depth: int = 6
    heads: int = 4                             # h
    mlp_dim: int = 256
    qkv_bias: bool = True
    norm_eps: float = 1e-6                     # timm's VisionTransformer default
    drop_path: float = 0.0
    encoding: str = "ape"                      # registry name, `a+b` composes
    encoding_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"npos_max": 10, "readout": "query"}
    # What imported ViTs need (timm, DeiT, DINOv2-style, Hugging Face; vitpe_core.importers).
    # The defaults are the models this project trains: one CLS token, read out by the head.
    class_token: bool = True                   # a CLS prefix token
    dist_token: bool = False                   # DeiT's distillation token; its head is averaged with the CLS head
    reg_tokens: int = 0                        # register tokens (no position, no read-out)
    no_embed_class: bool = False               # the `ape` table covers the patches only, not the prefix tokens
    layer_scale: bool = False                  # LayerScale `ls1.gamma` / `ls2.gamma` in every block
    pool: str = "token"                        # POOLS: "token" the CLS token, "avg" the mean of the patch tokens,
                                               # "token+avg" both concatenated, "map" attention pooling (`attn_pool`)
    fc_norm: bool = False                      # LayerNorm after pooling (timm's avg-pool models) instead of `norm`
    # Further imported families (BEiT, DINOv2/v3, CLIP, SigLIP); the defaults compute what the fields above describe.
    pre_norm: bool = False                     # a LayerNorm on the tokens before the first block (CLIP's pre_layrnorm)
    final_norm: bool = True                    # the LayerNorm `norm` after the last block (off: a read-out without it)
    act: str = "gelu"                          # ACTS: the MLP's activation
    mlp: str = "mlp"                           # MLPS: plain or gated MLP

    def __post_init__(self) -> None:
        object.__setattr__(self, "img_size", tuple(int(s) for s in self.img_size))
        sizes = {"img_size": min(self.img_size, default=0), "patch_size": self.patch_size, "in_chans": self.in_chans,
                 "num_classes": self.num_classes + 1, "dim": self.dim, "depth": self.depth, "heads": self.heads,
                 "mlp_dim": self.mlp_dim, "reg_tokens": self.reg_tokens + 1}   # 0 classes = no head, 0 registers
        bad = [k for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad or len(self.img_size) != 2:
            raise ValueError(f"{', '.join(bad) or 'img_size'} must be positive integers (img_size: height, width)")
        if self.dim % self.heads:
            raise ValueError(f"dim {self.dim} must be divisible by heads {self.heads}")
        if self.pool not in POOLS:
            raise ValueError(f"unknown pool {self.pool!r}; valid: {POOLS}")
        if self.pool in ("token", "token+avg") and not self.class_token or self.dist_token and not self.class_token:
            raise ValueError(f"pool={self.pool!r} and dist_token need a class token")
        for name, value, valid in (("act", self.act, ACTS), ("mlp", self.mlp, MLPS)):
            if value not in valid:
                raise ValueError(f"unknown {name} {value!r}; valid: {valid}")
        h, w = self.img_size
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(f"img_size {self.img_size} must be a multiple of patch_size {self.patch_size}")

    @property
    def grid(self) -> tuple[int, int]:
        """(H, W) patch grid the model is built for."""
        return (self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size)

    @property
    def num_prefix(self) -> int:
        """P: prefix tokens before the patches, in the order CLS, distillation, registers."""
        return int(self.class_token) + int(self.dist_token) + self.reg_tokens

    def prefix_names(self) -> list[str]:
        """A name per prefix token, in token order (for labels: "CLS", "dist", "reg 0", ...)."""
        return ["CLS"] * self.class_token + ["dist"] * self.dist_token + [f"reg {i}" for i in range(self.reg_tokens)]

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["img_size"] = list(self.img_size)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ViTConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ViTConfig fields {sorted(unknown)}; valid: {sorted(known)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


PRESETS: dict[str, dict[str, Any]] = {
    # D 128, 6 layers, 4 heads, MLP 256, patch 4 on 32x32: the compact-ViT comparison size.
    "compact": dict(img_size=(32, 32), patch_size=4, dim=128, depth=6, heads=4, mlp_dim=256),
    # ViT-S as in the SaPE² paper: D 384, 12 layers, 6 heads, patch 4 on 32x32.
    "paper": dict(img_size=(32, 32), patch_size=4, dim=384, depth=12, heads=6, mlp_dim=1536, drop_path=0.1),
    # A tiny model for tests and smoke runs.
    "tiny": dict(img_size=(32, 32), patch_size=8, dim=32, depth=2, heads=2, mlp_dim=64),
}


def preset_config(preset: str, **overrides: Any) -> ViTConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; valid: {sorted(PRESETS)}")
    return ViTConfig(**{**PRESETS[preset], **overrides})
