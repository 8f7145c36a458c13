"""The report's offline bias explorer: every patch's bias and attention rows of each image,
computed in advance and packed (`encode.pack`: float16, gzip, base64), plus the figures the
page's JavaScript (`report.js`) redraws when a patch is clicked.

What is kept, per image (a trace of the model on it, `analysis.trace_image`):
* the attention rows between patches, `(h, N, N)` per layer (the prefix tokens' columns left
  out, as the app's maps do; their share is kept as one number per layer, head and query);
* the bias rows the bias explorer offers (`views.bias_parts`): SaPE²'s x and y parts (their sum
  is added in the page), the full bias of a composite, any other encoding's bias row;
* attention rollout `(T, T)` for both head fusions (`positional.rollout`, from the float32 trace);
* the image as the model sees it (JPEG or PNG, the smaller) and the top-5 prediction.
Layers in `heads_layers` keep every head; the others keep only the mean over heads (the page
then offers "mean over heads" alone for them). `choose_heads_layers` picks them to fit a byte
budget. Arrays identical between images (a relative position bias) are stored once.
"""
from __future__ import annotations

import base64
import hashlib
import io
from dataclasses import dataclass
from typing import Callable

import numpy as np
from PIL import Image

from .. import analysis, figures, positional, views
from ..checkpoint import Checkpoint
from ..inputs import checkpoint_input, class_names, model_crop
from .encode import pack, packed_bytes

FUSIONS = ("mean", "max")
COMPONENT_OF_PART = {"row": ("bias",), "sum": ("x", "y"), "x": ("x",), "y": ("y",), "bias": ("bias",)}


@dataclass(frozen=True)
class ReportImage:
    """One image of the report: `label` (shown), `key` (a gallery id or `upload`), the picture."""

    label: str
    key: str
    image: Image.Image


@dataclass
class ImageTrace:
    """One image's trace and what the explorer keeps of it, before packing."""

    image: ReportImage
    trace: analysis.Trace
    display: np.ndarray                          # (h_px, w_px, 3) uint8, the image as the model sees it
    rows: dict[str, np.ndarray]                  # component -> (L, h, N, N) rows between patches


def image_trace(ckpt: Checkpoint, image: ReportImage) -> ImageTrace:
    """Trace `image` through `ckpt`'s model and cut out the rows between patches."""
    tr = analysis.trace_image(ckpt.model, checkpoint_input(image.image, ckpt))
    P = tr.num_prefix
    rows = {"attn": tr.attn[:, :, P:, P:]}
    parts = views.bias_parts(tr)
    sape = analysis.sape2_part_names(tr.parts)
    if "row" in parts or "bias" in parts:
        rows["bias"] = tr.bias[:, :, P:, P:]
    if sape is not None and "x" in parts:
        rows["x"], rows["y"] = tr.parts[sape[0]], tr.parts[sape[1]]
    grid = ckpt.config.grid
    display = figures.display_image(model_crop(image.image, ckpt), ckpt.config.img_size,
                                    max_side=max(320, 20 * max(grid)))
    return ImageTrace(image, tr, display, rows)


def layer_order(depth: int) -> list[int]:
    """Layers from most to least worth keeping per head: first and last, then the middle, then
    the layers that halve the gaps (evenly spread whatever the count kept)."""
    order: list[int] = []
    for k in range(1, depth + 1):
        for layer in np.linspace(0, depth - 1, k).round().astype(int):
            if int(layer) not in order:
                order.append(int(layer))
    return order


class LayerPacks:
    """Each image's rows packed per (image, component, layer, every head or their mean), each
    packed once: choosing the layers to keep and writing them share the work."""

    def __init__(self, traces: list[ImageTrace]) -> None:
        self.traces, self._memo = traces, {}

    def get(self, i: int, comp: str, layer: int, heads: bool) -> dict:
        key = (i, comp, layer, heads)
        if key not in self._memo:
            a = self.traces[i].rows[comp][layer]                                 # (h, N, N)
            self._memo[key] = pack(a if heads else a.mean(0, keepdims=True))     # (h | 1, N, N)
        return self._memo[key]

    def cost(self, layer: int, heads: bool) -> int:
        """Characters that one layer adds over every image and component."""
        return sum(packed_bytes(self.get(i, c, layer, heads)) for i, t in enumerate(self.traces) for c in t.rows)


def choose_heads_layers(packs: LayerPacks, budget: int) -> list[int]:
    """The layers (in `layer_order`) whose every head fits into `budget` more characters than
    the head means of the same layers take; sorted."""
    depth, left, chosen = packs.traces[0].trace.attn.shape[0], budget, []
    for layer in layer_order(depth):
        extra = packs.cost(layer, True) - packs.cost(layer, False)
        if extra > left:
            break
        chosen.append(layer)
        left -= extra
    return sorted(chosen)


def _image_uri(rgb: np.ndarray) -> str:
    """The smaller of PNG and JPEG (quality 90) as a data URI."""
    img, best = Image.fromarray(rgb), None
    for fmt, mime, kw in (("PNG", "image/png", {"optimize": True}), ("JPEG", "image/jpeg", {"quality": 90})):
        buf = io.BytesIO()
        img.save(buf, format=fmt, **kw)
        if best is None or buf.tell() < len(best[1]):
            best = (mime, buf.getvalue())
    return f"data:{best[0]};base64," + base64.b64encode(best[1]).decode("ascii")


class _Blobs:
    """Packed arrays, each stored once (by content), referred to by index."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self._index: dict[str, int] = {}

    def add(self, a: np.ndarray | dict) -> int:
        """An array (packed here) or an already packed one; its index."""
        packed = a if isinstance(a, dict) else pack(a)
        key = hashlib.sha256(packed["gz"].encode() + str(packed["shape"]).encode()).hexdigest()
        if key not in self._index:
            self._index[key] = len(self.items)
            self.items.append(packed)
        return self._index[key]


def part_texts(t: ImageTrace, ckpt: Checkpoint) -> dict[str, dict[str, str]]:
    """part -> its chart name and caption as the app words them (`views.bias_short`,
    `views.bias_caption`; they depend on the part alone)."""
    tr, out = t.trace, {}
    maps = analysis.patch_maps(tr, (0, 0))
    for part in views.bias_parts(tr):
        bv = views.bias_view(tr, maps, ckpt.config.encoding, 0, None, part)
        caption = views.bias_caption(bv).replace("; the NPY download holds the raw values.", ".")  # the app's only
        out[part] = {"short": views.bias_short(bv), "caption": caption, "label": views.PART_LABELS[part]}
    return out


def explorer_data(ckpt: Checkpoint, packs: LayerPacks, heads_layers: list[int],
                  progress: Callable[[str], None] = lambda _: None) -> dict:
    """The explorer's JSON: the model's geometry, the parts offered, and per image its picture,
    prediction, packed rows per component and layer, rollouts and prefix shares; `blobs`
    holds the packed arrays."""
    traces = packs.traces
    cfg, first = ckpt.config, traces[0].trace
    depth, heads = first.attn.shape[:2]
    names, blobs, images = class_names(ckpt), _Blobs(), []
    for i, t in enumerate(traces):
        progress(f"packing {t.image.label}")
        tr, P = t.trace, t.trace.num_prefix
        comps = {c: [blobs.add(packs.get(i, c, layer, layer in heads_layers)) for layer in range(depth)]
                 for c in t.rows}
        share = tr.attn[:, :, P:, :P].sum(-1)                                      # (L, h, N)
        rollouts = {f: blobs.add(positional.rollout(tr.attn, f)) for f in FUSIONS}  # (T, T) each
        images.append({"label": t.image.label, "key": t.image.key, "image": _image_uri(t.display),
                       "size": [int(t.display.shape[1]), int(t.display.shape[0])],
                       "top5": [[n, round(p, 5)] for n, p in views.top_k(tr.probs, names)],
                       "components": comps, "rollout": rollouts, "prefix_share": blobs.add(share)})
    return {"grid": list(cfg.grid), "depth": int(depth), "heads": int(heads), "num_prefix": int(first.num_prefix),
            "prefix": list(first.prefix), "rollout_sources": positional.rollout_sources(first.num_prefix,
                                                                                        first.prefix),
            "heads_layers": sorted(int(x) for x in heads_layers), "encoding": cfg.encoding,
            "parts": part_texts(traces[0], ckpt), "part_components": COMPONENT_OF_PART,
            "patch": [cfg.grid[0] // 2, cfg.grid[1] // 2], "images": images, "blobs": blobs.items}


def explorer_figures(ckpt: Checkpoint, t: ImageTrace, patch: tuple[int, int]) -> dict[str, object]:
    """The explorer's three charts for the first image, drawn by the app's own builder
    (`figures.overlay_fig`); the page swaps their map, title, outline and picture on a click.
    The picture itself is left out here (each image's is in the data)."""
    tr, grid = t.trace, ckpt.config.grid
    maps = analysis.patch_maps(tr, patch)
    parts = views.bias_parts(tr)
    out: dict[str, object] = {}
    if parts:
        bv = views.bias_view(tr, maps, ckpt.config.encoding, 0, None, parts[0])
        out["bias"] = figures.overlay_fig(t.display, bv.shown, grid, patch=patch, title="layer 0, mean over heads",
                                          colorbar_title="bias<br>(0-1)")
    out["attn"] = figures.overlay_fig(t.display, views.attention_view(maps, 0, None), grid, patch=patch,
                                      title="layer 0, mean over heads", colorbar_title="attention",
                                      colorscale=figures.ATTENTION_SCALE, zmin=0, zmax=None)
    token = tr.num_prefix + analysis.patch_index(patch, grid)
    m, _ = positional.rollout_map(tr.attn, grid, tr.num_prefix, token)
    out["rollout"] = figures.overlay_fig(t.display, m, grid, patch=patch, title="heads fused by mean",
                                         colorbar_title="rollout", colorscale=figures.ATTENTION_SCALE, zmin=0,
                                         zmax=None)
    return out
