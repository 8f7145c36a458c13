"""`SwinConfig`: a Swin or Swin-V2 model, completely (serialised into its checkpoint).

A checkpoint's stored config carries `"arch": "swin"`, which tells `checkpoint.load_checkpoint`
to build a `SwinTransformer` instead of a `ViT` (a ViT config has no `arch`).

Windows: `window_size` is the model's (Hugging Face `config.window_size`); `stage_windows` and
`stage_shifts` are the window and the shift of the odd blocks of each stage as the model was
built at `img_size` (`build_windows`): a stage whose grid is not larger than the window takes one
window of the grid's size and no shift, as Hugging Face does.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

ARCH = "swin"


def stage_grid(grid: tuple[int, int], stage: int) -> tuple[int, int]:
    """The token grid of `stage` for a first-stage grid `grid`: each patch merging halves it,
    rounding up (odd sizes are padded by one row / column)."""
    h, w = grid
    for _ in range(stage):
        h, w = (h + 1) // 2, (w + 1) // 2
    return h, w


def build_grid(img_size: tuple[int, int], patch: int, version: int) -> tuple[int, int]:
    """The first-stage grid `build_windows` decides on: Swin's the image padded to whole patches
    (what it runs on); Swin-V2's `image_size // patch_size`, rounded down, as Hugging Face's
    `Swinv2Model` builds its layers (`embeddings.patch_grid`)."""
    if version == 1:
        return -(-img_size[0] // patch), -(-img_size[1] // patch)
    return img_size[0] // patch, img_size[1] // patch


def build_windows(version: int, window: int, grid: tuple[int, int], stages: int
                  ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(window, odd-block shift) per stage, as Hugging Face builds them for first-stage `grid`
    (`build_grid`). Swin: a grid whose shorter side is at most the window is one window, unshifted;
    its stages' grids are rounded up (odd grids are padded before merging). Swin-V2
    (`Swinv2Layer._compute_window_shift`) decides on the grid's height alone, the stage's
    `grid // 2**s` rounded down (`Swinv2Encoder`'s `input_resolution`; at least 1, where Hugging
    Face's would be an empty window it cannot run)."""
    windows, shifts = [], []
    for s in range(stages):
        h, w = stage_grid(grid, s) if version == 1 else (max(1, grid[0] >> s), max(1, grid[1] >> s))
        side = min(h, w) if version == 1 else h
        windows.append(min(side, window))
        shifts.append(0 if side <= window else window // 2)
    return tuple(windows), tuple(shifts)


@dataclass(frozen=True)
class SwinConfig:
    version: int = 1                            # 1: Swin (relative position bias table); 2: Swin-V2 (CPB, cosine)
    img_size: tuple[int, int] = (224, 224)      # (height, width) in pixels the model is built for
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 1000                     # 0: no head, the pooled features are returned
    embed_dim: int = 96                         # C of the first stage; stage s has C * 2**s
    depths: tuple[int, ...] = (2, 2, 6, 2)
    num_heads: tuple[int, ...] = (3, 6, 12, 24)
    window_size: int = 7
    stage_windows: tuple[int, ...] = ()         # () = build_windows(...) at img_size
    stage_shifts: tuple[int, ...] = ()
    pretrained_window_sizes: tuple[int, ...] = ()   # Swin-V2: the CPB's coordinate normalisation (0 = own window)
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    norm_eps: float = 1e-5                      # the blocks' and the final norm's (the embedding / merging norms: 1e-5)
    absolute_pos_embed: bool = False            # Swin only: a learned table added after the patch embedding

    def __post_init__(self) -> None:
        fix = object.__setattr__
        fix(self, "img_size", tuple(int(s) for s in self.img_size))
        for name in ("depths", "num_heads", "stage_windows", "stage_shifts", "pretrained_window_sizes"):
            fix(self, name, tuple(int(v) for v in getattr(self, name)))
        if self.version not in (1, 2):
            raise ValueError(f"version must be 1 (Swin) or 2 (Swin-V2), got {self.version!r}")
        S = len(self.depths)
        ints = {"patch_size": self.patch_size, "in_chans": self.in_chans, "embed_dim": self.embed_dim,
                "window_size": self.window_size, "num_classes": self.num_classes + 1}
        bad = [k for k, v in ints.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1]
        if bad or len(self.img_size) != 2 or min(self.img_size) < 1 or S < 1:
            raise ValueError(f"{', '.join(bad) or 'img_size / depths'} must be positive (img_size: height, width)")
        if len(self.num_heads) != S or min(self.depths) < 1 or min(self.num_heads) < 1:
            raise ValueError(f"depths {self.depths} and num_heads {self.num_heads} must be positive, one per stage")
        for s, h in enumerate(self.num_heads):
            if (self.embed_dim * 2 ** s) % h:
                raise ValueError(f"stage {s}: width {self.embed_dim * 2 ** s} is not divisible by {h} heads")
        if not self.stage_windows:
            w, sh = build_windows(self.version, self.window_size, build_grid(self.img_size, self.patch_size,
                                                                             self.version), S)
            fix(self, "stage_windows", w)
            fix(self, "stage_shifts", sh)
        if len(self.stage_windows) != S or len(self.stage_shifts) != S:
            raise ValueError(f"stage_windows {self.stage_windows} and stage_shifts {self.stage_shifts} need one "
                             f"entry per stage ({S})")
        if min(self.stage_windows) < 1 or any(not 0 <= sh < w for sh, w in zip(self.stage_shifts, self.stage_windows)):
            raise ValueError(f"stage windows {self.stage_windows} must be positive, shifts {self.stage_shifts} "
                             "smaller than their window")
        if self.pretrained_window_sizes and len(self.pretrained_window_sizes) < S:
            raise ValueError(f"pretrained_window_sizes {self.pretrained_window_sizes}: one per stage ({S})")
        if self.version == 2 and self.absolute_pos_embed:
            raise ValueError("Swin-V2 with an absolute table is not supported (Hugging Face's cannot run it either)")
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be positive, got {self.mlp_ratio}")

    # ------------------------------------------------------------------ derived sizes
    @property
    def arch(self) -> str:
        return ARCH

    @property
    def encoding(self) -> str:
        """What positions are encoded with, for listings (not an `encodings` registry name)."""
        base = "swin window RPB" if self.version == 1 else "swin-v2 window CPB"
        return base + (" + ape" if self.absolute_pos_embed else "")

    @property
    def grid(self) -> tuple[int, int]:
        """(H, W) first-stage patch grid the model is built for (the image padded to whole patches)."""
        p = self.patch_size
        return (-(-self.img_size[0] // p), -(-self.img_size[1] // p))

    @property
    def stages(self) -> int:
        return len(self.depths)

    @property
    def depth(self) -> int:
        """Blocks in all stages: the `trace` has one entry per block, in this order."""
        return sum(self.depths)

    @property
    def heads(self) -> int:
        """The most heads of any stage (a page's head picker; stage s has `num_heads[s]`)."""
        return max(self.num_heads)

    def stage_dim(self, stage: int) -> int:
        return self.embed_dim * 2 ** stage

    @property
    def num_features(self) -> int:
        return self.stage_dim(self.stages - 1)

    def mlp_dim(self, stage: int) -> int:
        return int(self.mlp_ratio * self.stage_dim(stage))

    def block_of(self, layer: int) -> tuple[int, int]:
        """(stage, block within the stage) of block `layer` counted over all stages."""
        if not 0 <= layer < self.depth:
            raise ValueError(f"block {layer} out of range: the model has {self.depth} blocks")
        for s, d in enumerate(self.depths):
            if layer < d:
                return s, layer
            layer -= d
        raise AssertionError("unreachable")

    def layout(self, stage: int, grid: tuple[int, int]) -> tuple[int, int]:
        """(window, shift of the odd blocks) of `stage` when its token grid is `grid`. Swin
        decides at every call, as Hugging Face's `SwinLayer.set_shift_and_window_size` does (a grid
        whose shorter side is at most the window is one window, unshifted); Swin-V2 keeps what it
        was built with (`stage_windows`, `stage_shifts`), as Hugging Face's does."""
        if self.version == 2:
            return self.stage_windows[stage], self.stage_shifts[stage]
        side = min(grid)
        return (side, 0) if side <= self.window_size else (self.window_size, self.window_size // 2)

    def pretrained_window(self, stage: int) -> int:
        return self.pretrained_window_sizes[stage] if self.pretrained_window_sizes else 0

    def approx_elements(self) -> int:
        """About how many values building this config allocates, from its sizes alone (checked
        against a file's tensors before building: a forged config must not allocate gigabytes)."""
        n = self.patch_size ** 2 * self.in_chans * self.embed_dim + self.num_classes * self.num_features
        if self.absolute_pos_embed:
            n += self.grid[0] * self.grid[1] * self.embed_dim
        for s, (d, h) in enumerate(zip(self.depths, self.num_heads)):
            c, w = self.stage_dim(s), self.stage_windows[s]
            table = (2 * w - 1) ** 2 * h if self.version == 1 else 512 * (2 + h) + h
            n += d * (4 * c * c + 2 * c * self.mlp_dim(s) + table) + (8 * c * c if s < self.stages - 1 else 0)
        return n

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
        return {"arch": ARCH, **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SwinConfig":
        d = dict(d)
        arch = d.pop("arch", ARCH)
        if arch != ARCH:
            raise ValueError(f"not a Swin config (arch {arch!r})")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown SwinConfig fields {sorted(unknown)}; valid: {sorted(known)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)
