"""The notebook API: a small façade over vitpe_core for Jupyter (no Streamlit needed). Each
function returns a Plotly figure (shown by Jupyter when it is a cell's last value) or writes a
file. The figures are the app's own (`vitpe_core.figures`, from `analysis`, `positional` and
`views`), so a notebook and the app show the same thing.

    from vitpe_core import explore as vx
    m = vx.load("sape2+ape")                       # a shipped checkpoint by name (checkpoints/)
    m = vx.load("my_vit.safetensors")              # a vitpe checkpoint, or timm / DeiT / DINOv2 /
                                                   # Hugging Face / RoPE-ViT weights (importers)
    vx.card(m)                                     # the model card, as (field, value) rows
    vx.similarity(m)                               # Figure 7 of its table, titled with its 2D score
    vx.bias(m, "cifar10-test-0000", patch=(3, 4), layer=2)      # bias row over the image
    vx.attention(m, "photo-chelsea", patch=(3, 4), layer=2, head=1)
    vx.rollout(m, "photo.jpg")                     # any image file, a PIL image, or a gallery id
    vx.kernels(m); vx.query_kernels(m, patch=(0, 0)); vx.attention_distance(m)
    vx.resolution(m)                               # 0.5x-2x its input size: what it keeps (resolution.py)
    vx.report(m, "out.html")                       # the self-contained HTML report (html_report)

Images: a gallery id (`vitpe_core.gallery.gallery_ids()`), a path to an image file (decoded by
`images.load_image`, the app's safe decoder) or a `PIL.Image`. `patch=None` is the grid's
centre; `head=None` the mean over heads; layers count from 0.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from . import analysis, figures, positional, views
from .checkpoint import (Checkpoint, NotVitpeCheckpointError, group_and_stem, listed_checkpoints, load_checkpoint,
                         resolve_checkpoint)
from .gallery import gallery_caption, gallery_ids, gallery_image
from .html_report import ReportImage, write_report
from .html_report.build import file_sha256, model_card, weights_sha256
from .inputs import checkpoint_input, image_key, model_crop

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"


def checkpoint_dir() -> Path:
    """Where shipped checkpoints are looked up by name: `$VITPE_CHECKPOINTS`, else the
    repository's `checkpoints/` (as the app does)."""
    value = os.environ.get("VITPE_CHECKPOINTS", "").strip()
    return Path(value).expanduser() if value else CHECKPOINTS


@dataclass
class Model:
    """A loaded model: its checkpoint, the file it came from (None: built in memory) and that
    file's sha256; traces and the position analysis are computed once and kept here."""

    ckpt: Checkpoint
    path: Path | None
    content_hash: str
    _traces: dict = field(default_factory=dict, repr=False)
    _position: dict | None = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return self.ckpt.name

    @property
    def config(self):
        return self.ckpt.config

    def __repr__(self) -> str:
        cfg = self.config
        return (f"Model({self.name!r}: {cfg.encoding}, {cfg.grid[0]}x{cfg.grid[1]} patches, {cfg.depth} layers, "
                f"{cfg.heads} heads)")


def shipped() -> list[str]:
    """The names `load` accepts without a path (`ape`, `long/ape`, ...)."""
    return listed_checkpoints(checkpoint_dir())


def load(name_or_path: str | Path) -> Model:
    """A shipped checkpoint by name (`shipped()`), or a file: a vitpe checkpoint, or weights of
    another project brought in by the importers (`python -m vitpe_core import` does the same)."""
    text = str(name_or_path)
    if text in shipped():
        group, stem = group_and_stem(text)
        path = resolve_checkpoint(stem, checkpoint_dir() / group)
        ckpt = load_checkpoint(path)
        ckpt.name = text
        return Model(ckpt, path, file_sha256(path))
    path = Path(text).expanduser()
    if not path.is_file():
        raise ValueError(f"{text!r} is neither a shipped checkpoint ({', '.join(shipped())}) nor a file")
    if path.suffix not in (".safetensors", ".npz", ".pth", ".pt", ".bin"):
        raise ValueError(f"{path.name}: expected a .safetensors, .npz, .pth, .pt or .bin file")
    if path.suffix == ".safetensors":     # a vitpe checkpoint, else another project's weights (below)
        try:
            return Model(load_checkpoint(path), path, file_sha256(path))
        except NotVitpeCheckpointError:
            pass
    from .importers import import_file
    from .metrics import sanitize_metrics

    imp = import_file(path)
    metrics, _ = sanitize_metrics(imp.metrics(path.name))
    return Model(Checkpoint(imp.model, imp.model.cfg, metrics, {}, path.stem), None, file_sha256(path))


def from_checkpoint(ckpt: Checkpoint, path: str | Path | None = None) -> Model:
    """A `Model` of a checkpoint already in memory (its hash: the file's, else its weights')."""
    return Model(ckpt, None if path is None else Path(path),
                 file_sha256(path) if path is not None else weights_sha256(ckpt))


def as_image(image: str | Path | Image.Image | ReportImage | None) -> ReportImage:
    """A gallery id, an image file, a PIL image (or None: the first gallery image) as a
    `ReportImage`."""
    from .images import load_image

    if image is None:
        image = gallery_ids()[0]
    if isinstance(image, ReportImage):
        return image
    if isinstance(image, Image.Image):
        return ReportImage("your image", "image", image.convert("RGB"))
    if str(image) in gallery_ids():
        return ReportImage(gallery_caption(str(image)), str(image), gallery_image(str(image)))
    path = Path(image).expanduser()
    if not path.is_file():
        raise ValueError(f"{str(image)!r} is neither a gallery image ({', '.join(gallery_ids())}) nor a file")
    return ReportImage(path.name, path.name, load_image(path.read_bytes()))


def _trace(m: Model, image) -> tuple[ReportImage, analysis.Trace]:
    img = as_image(image)
    key = image_key(img.image)                                                  # by content
    if key not in m._traces:
        m._traces[key] = analysis.trace_image(m.ckpt.model, checkpoint_input(img.image, m.ckpt))
    return img, m._traces[key]


def _view(m: Model, patch, layer: int, head: int | None) -> tuple[tuple[int, int], int, int | None]:
    cfg = m.config
    patch = (cfg.grid[0] // 2, cfg.grid[1] // 2) if patch is None else (int(patch[0]), int(patch[1]))
    analysis.patch_index(patch, cfg.grid)                                       # raises outside the grid
    if not 0 <= layer < cfg.depth:
        raise ValueError(f"layer {layer}: this model has layers 0-{cfg.depth - 1}")
    if head is not None and not 0 <= head < cfg.heads:
        raise ValueError(f"head {head}: this model has heads 0-{cfg.heads - 1} (None = their mean)")
    return patch, layer, head


def _display(m: Model, img: ReportImage) -> np.ndarray:
    grid = m.config.grid
    return figures.display_image(model_crop(img.image, m.ckpt), m.config.img_size, max_side=max(320, 20 * max(grid)))


def card(m: Model) -> list[tuple[str, str]]:
    """The model card (source, encoding, grid, prefix tokens, accuracy, licence) as rows."""
    return model_card(m.ckpt)


def similarity(m: Model, epoch: int | None = None):
    """Figure 7 of the model's table (at a recorded `epoch`, default the final table), titled
    with its 2D-structure score; ValueError for an encoding without a table."""
    params = None
    if epoch is not None:
        if epoch not in m.ckpt.history:
            raise ValueError(f"epoch {epoch} is not recorded; recorded: {sorted(m.ckpt.history) or 'none'}")
        params = m.ckpt.history[epoch]
    table = analysis.position_table(m.ckpt.model, params=params)
    if table is None:
        raise ValueError(f"{m.name}: encoding {m.config.encoding!r} has no position table")
    sim = analysis.cosine_similarity(table)
    score = analysis.structure_score(sim, m.config.grid)["spearman"]
    when = "" if epoch is None else f", epoch {epoch}"
    return figures.figure7_grid_fig(analysis.similarity_grid(sim, m.config.grid),
                                    title=f"Figure 7 of {m.name}{when}: 2D score {score:.3f}")


def bias(m: Model, image=None, patch: tuple[int, int] | None = None, layer: int = 0, head: int | None = None,
         part: str | None = None):
    """The encoding's bias row of query `patch` over the image, normalised to 0–1 as the app
    draws it (`views.bias_view`); `part`: one of `views.bias_parts` (SaPE²: "sum", "x", "y").
    A model without a bias gets its attention row instead (as the app's bias explorer shows)."""
    img, tr = _trace(m, image)
    patch, layer, head = _view(m, patch, layer, head)
    parts = views.bias_parts(tr)
    if not parts:
        return attention(m, image, patch, layer, head)
    if part is not None and part not in parts:
        raise ValueError(f"part {part!r}: this model offers {parts}")
    bv = views.bias_view(tr, analysis.patch_maps(tr, patch), m.config.encoding, layer, head, part or parts[0])
    return figures.overlay_fig(_display(m, img), bv.shown, m.config.grid, patch=patch, colorbar_title="bias<br>(0-1)",
                               title=f"{views.bias_short(bv)}, layer {layer}, {views.head_text(head)}")


def attention(m: Model, image=None, patch: tuple[int, int] | None = None, layer: int = 0, head: int | None = None):
    """The full model's attention row of query `patch` over the image (`views.attention_view`)."""
    img, tr = _trace(m, image)
    patch, layer, head = _view(m, patch, layer, head)
    a = views.attention_view(analysis.patch_maps(tr, patch), layer, head)
    return figures.overlay_fig(_display(m, img), a, m.config.grid, patch=patch, colorbar_title="attention",
                               title=f"Attention, layer {layer}, {views.head_text(head)}",
                               colorscale=figures.ATTENTION_SCALE, zmin=0, zmax=None)


def rollout(m: Model, image=None, patch: tuple[int, int] | None = None, token: str = "patch", fusion: str = "mean"):
    """Attention rollout (`positional.rollout_map`) of query `patch`, or of a prefix `token`
    ("CLS", ...), heads fused by `fusion` ("mean" or "max"), over the image."""
    img, tr = _trace(m, image)
    patch, _, _ = _view(m, patch, 0, None)
    sources = positional.rollout_sources(tr.num_prefix, tr.prefix)
    if token not in sources:
        raise ValueError(f"token {token!r}: this model offers {sources}")
    index = tr.num_prefix + analysis.patch_index(patch, tr.grid) if token == "patch" else sources.index(token) - 1
    mp, share = positional.rollout_map(tr.attn, tr.grid, tr.num_prefix, index, fusion)
    what = f"patch ({patch[0]}, {patch[1]})" if token == "patch" else token
    return figures.overlay_fig(_display(m, img), mp, tr.grid, patch=patch if token == "patch" else None,
                               title=f"Rollout of {what}, heads fused by {fusion}", colorbar_title="rollout",
                               colorscale=figures.ATTENTION_SCALE, zmin=0, zmax=None)


def position(m: Model) -> dict[str, np.ndarray]:
    """`positional.analyze`'s arrays (the cache beside a checkpoint file when current)."""
    if m._position is None:
        cached = positional.read_cache(m.path) if m.path is not None else None
        m._position = cached if cached is not None else positional.analyze(m.ckpt)[1]
    return m._position


def kernels(m: Model, head: int | None = None):
    """The position-only kernel of every layer over the offset, titled with its relative score
    (`views.kernel_view`); ValueError for a model without position information."""
    arrays = position(m)
    if str(arrays["kind"]) == "none":
        raise ValueError(f"{m.name}: no position information, no kernel")
    ks, scores = {}, {}
    for layer in range(arrays["offset_kernel"].shape[0]):
        ks[f"layer {layer}"], scores[f"layer {layer}"] = views.kernel_view(arrays, layer, head)
    return figures.kernels_fig(ks, scores, cols=min(6, len(ks)),
                               title=f"Position-only kernels of {m.name}, {views.head_text(head)}")


def query_kernels(m: Model, patch: tuple[int, int] | None = None, head: int | None = None):
    """Every layer's kernel row of query `patch` on the image grid, with its fit
    (`views.query_kernel_view`)."""
    arrays = position(m)
    if str(arrays["kind"]) == "none":
        raise ValueError(f"{m.name}: no position information, no kernel")
    patch, _, head = _view(m, patch, 0, head)
    maps, fits, patches = {}, {}, {}
    for layer in range(arrays["kernel"].shape[0]):
        label = f"layer {layer}"
        (maps[label], fits[label]), patches[label] = views.query_kernel_view(arrays, layer, head, patch,
                                                                             m.config.grid), patch
    return figures.query_kernels_fig(maps, patches, fits, cols=min(6, len(maps)),
                                     title=f"Per query: patch ({patch[0]}, {patch[1]}) to every key, "
                                           f"{views.head_text(head)}")


def resolution(m: Model, sizes: Sequence[tuple[int, int]] | None = None, *, rule: str = "model",
               progress: bool = True):
    """The resolution sweep (`resolution.sweep`) on the gallery images: at each input size (default
    `resolution.default_sizes`: 0.5x-2x in whole patches and one rectangular) the top-1 agreement
    and feature cosine to the native size, the resampled table's 2D structure, the position kernel's
    relative score; a figure, its rows under `fig.layout.meta["rows"]` (`resolution.rows_json`).
    `rule`: whose resampling of its tables ("timm", "transformers"; default the model's own)."""
    from tqdm.auto import tqdm

    from . import resolution as res
    cfg = m.config
    sizes = res.default_sizes(cfg.img_size, cfg.patch_size) if sizes is None else sizes
    bar = tqdm(total=len(res.check_sizes([*sizes, tuple(cfg.img_size)], cfg.patch_size)), disable=not progress,
               desc=f"{m.name}: input sizes")
    rows = res.sweep(m.ckpt.model, positional.image_set(m.ckpt), sizes, on_size=lambda i, n, s: bar.update(i - bar.n),
                     rule=rule)
    bar.update(bar.total - bar.n)
    bar.close()
    fig = figures.resolution_fig(rows, title=f"{m.name} at other input sizes")
    fig.layout.meta = {"rows": res.rows_json(rows)}
    return fig


def attention_distance(m: Model):
    """Mean attention distance by depth: every head as a dot, their mean as a line."""
    return figures.distance_by_depth_fig({m.name: position(m)["mean_distance"]},
                                         title=f"Mean attention distance by depth, {m.name}")


def report(m: Model, out: str | Path, images: Sequence | None = None, layers: Sequence[int] | None = None) -> Path:
    """Write the self-contained HTML report (`vitpe_core.html_report`) of `m` to `out`;
    `images`: gallery ids, files or PIL images (default: four gallery images)."""
    imgs = None if images is None else [as_image(i) for i in images]
    return write_report(m.ckpt, out, images=imgs, path=m.path, layers=layers, content_hash=m.content_hash,
                        command=f"vitpe_core.explore.report({m.name!r}, {str(out)!r})")
