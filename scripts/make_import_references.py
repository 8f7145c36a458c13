"""Reference outputs of the real implementations, for tests/test_importers.py and
tests/test_importers_timm_families.py.

timm cannot be installed beside the project's CPU torch (its torchvision needs another torch),
so this script runs once in a side environment and writes small random-weight models with
their outputs to tests/data/import_references.safetensors:

    python -m venv /tmp/timm-env
    /tmp/timm-env/bin/pip install torch==2.14.1 torchvision==0.29.1 timm==1.0.31 safetensors
    /tmp/timm-env/bin/python scripts/make_import_references.py [--only timm-families|sizes|rope]

For every case: the model's state dict in its own key names, a fixed input, the logits (or
features), every layer's attention weights (timm's non-fused path, read at `attn_drop`),
and the timm kwargs in the metadata. Also `timm.layers.resample_abs_pos_embed` on random
tables.

The timm layouts of the other pretrained families go to a second, small file,
tests/data/import_references_timm_families.safetensors (`--only timm-families` writes it alone;
the first file's logits move by an ulp between CPUs, so it is kept as committed): `Beit`
(per-layer and shared tables, mean and CLS read-out), `SwinTransformer` and `SwinTransformerV2`
(shifted windows, a stage clamped to its grid, pretrained windows), CLIP- and SigLIP-style
`VisionTransformer`s (`norm_pre` + quick-GELU; `attn_pool` + GELU-tanh), DINOv2-g's packed
SwiGLU (`SwiGLUPacked`, SiLU), EVA-02 (`Eva`: RoPE on a reference grid, packed SwiGLU) and DINOv3
(`Eva` with DINOv3's rotary embedding, registers, LayerScale; plain and SwiGLU MLPs), each
built by `timm.create_model` from a real architecture name with small overrides, so the
`config.json` timm itself writes for it (`save_config_for_hf`: `architecture`, `model_args`,
`pretrained_cfg`) is stored beside the case in the metadata. Swin's attention is read per block
(`B·nW, h, N, N`) at each `WindowAttention.attn_drop`.

Other sizes go to a third file, tests/data/import_references_sizes_timm.safetensors (`--only sizes`
writes it alone; tests/test_import_sizes_timm.py): one case per timm-layout family (`SIZE_CASES`),
its state dict and config.json, and at a larger square and a rectangular size an input (float16,
exactly) and timm's logits by both of its paths: the model created at that size loaded through the
model module's own `checkpoint_filter_fn`, and the native model built with `dynamic_img_size=True`
(where the class takes it; timm's `Beit` does not).

RoPE-ViT goes to a fourth file, tests/data/import_references_rope.safetensors (`--only rope` writes it, and
only that mode; tests/test_import_rope_vit.py): timm's port (`vit_*_patch16_rope_*`: axial and mixed, with and
without a table, one on a non-square grid) at its own size, a larger square and a rectangle by timm's two paths as
above, and the original's cases of the first file (the same weights) run by its own forward at those sizes (the
table resampled bicubically without antialiasing, the rotations recomputed for the grid).

The RoPE-ViT cases are not built with a library (naver-ai/rope-vit is a research repository on
top of timm, not a package): its attention is written out here from its published model code
(complex rotations, `freqs (2, depth, heads*d/2)`, `gamma_1/2`), on timm's DeiT-III blocks, as
an independent check of the importer's key and layout mapping.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed, set_fused_attn
from timm.models.vision_transformer import VisionTransformer
from timm.models.deit import VisionTransformerDistilled

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "import_references.safetensors"
OUT_FAMILIES = OUT.with_name("import_references_timm_families.safetensors")
OUT_SIZES = OUT.with_name("import_references_sizes_timm.safetensors")
OUT_ROPE = OUT.with_name("import_references_rope.safetensors")
SMALL = dict(embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=7)

TIMM_CASES = {   # name -> (class, kwargs, input (H, W))
    "timm_cls": (VisionTransformer, dict(img_size=32, patch_size=8, **SMALL), (32, 32)),
    "timm_gap_fcnorm_noqkvbias": (VisionTransformer, dict(img_size=32, patch_size=8, class_token=False,
                                                          global_pool="avg", qkv_bias=False, **SMALL), (32, 32)),
    "timm_reg4_noembed_ls_nonsquare": (VisionTransformer, dict(img_size=(24, 40), patch_size=8, reg_tokens=4,
                                                               no_embed_class=True, init_values=0.5, **SMALL),
                                       (24, 40)),
    "timm_deit_distilled": (VisionTransformerDistilled, dict(img_size=32, patch_size=8, **SMALL), (32, 32)),
    "timm_deit3_ls_noembed": (VisionTransformer, dict(img_size=32, patch_size=8, no_embed_class=True,
                                                      init_values=0.5, **SMALL), (32, 32)),
    "timm_dinov2_style_reg_other_size": (VisionTransformer, dict(img_size=48, patch_size=8, reg_tokens=2,
                                                                 no_embed_class=True, init_values=0.5, **SMALL),
                                         (32, 32)),   # table trained on 6x6, run at 4x4 (dynamic_img_size)
}


def _attn_recorder(blocks) -> list:
    rec: list = []
    for blk in blocks:
        blk.attn.attn_drop.register_forward_hook(lambda m, inp, out: rec.append(inp[0].detach().clone()))
    return rec


def _randomise(model: nn.Module) -> None:
    """Random values everywhere (LayerScale and norms too), so every weight matters."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.ndim > 1 else 0.5) + (1.0 if "norm" in name
                                                                                          and "weight" in name else 0))


def timm_case(cls, kwargs, size) -> dict[str, torch.Tensor]:
    dynamic = size != (kwargs["img_size"],) * 2 and not isinstance(kwargs["img_size"], tuple)
    model = cls(**kwargs, dynamic_img_size=dynamic).eval()
    _randomise(model)
    rec = _attn_recorder(model.blocks)
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(x)
    out = {f"sd.{k}": v.contiguous() for k, v in model.state_dict().items()}
    out.update({"x": x, "logits": logits, **{f"attn.{i}": a for i, a in enumerate(rec)}})
    return out


# ----------------------------------------------------------------------------- RoPE-ViT, written out
def _t_xy(end_x: int, end_y: int):
    t = torch.arange(end_x * end_y, dtype=torch.float32)
    return t % end_x, torch.div(t, end_x, rounding_mode="floor")


def _axial_cis(dim: int, end_x: int, end_y: int, theta: float = 100.0):
    f = 1.0 / (theta ** (torch.arange(0, dim, 4)[: dim // 4].float() / dim))
    t_x, t_y = _t_xy(end_x, end_y)
    fx, fy = torch.outer(t_x, f), torch.outer(t_y, f)
    return torch.cat([torch.polar(torch.ones_like(fx), fx), torch.polar(torch.ones_like(fy), fy)], dim=-1)


def _mixed_cis(freqs, t_x, t_y, heads):
    N, depth = t_x.shape[0], freqs.shape[1]
    fx = (t_x.unsqueeze(-1) @ freqs[0].unsqueeze(-2)).view(depth, N, heads, -1).permute(0, 2, 1, 3)
    fy = (t_y.unsqueeze(-1) @ freqs[1].unsqueeze(-2)).view(depth, N, heads, -1).permute(0, 2, 1, 3)
    return torch.polar(torch.ones_like(fx), fx + fy)


def _rotate(x, cis):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    shape = [d if i >= xc.ndim - cis.ndim else 1 for i, d in enumerate(xc.shape)]
    return torch.view_as_real(xc * cis.view(*shape)).flatten(3)


def _rope_model(mixed: bool, ape: bool) -> tuple[VisionTransformer, torch.Tensor | None]:
    """timm's DeiT-III blocks with random weights (and RoPE-Mixed's random `freqs`): a RoPE-ViT's parameters."""
    D, depth, heads, p, S, C = 32, 2, 2, 8, 32, 7
    d = D // heads
    base = VisionTransformer(img_size=S, patch_size=p, embed_dim=D, depth=depth, num_heads=heads, mlp_ratio=2.0,
                             num_classes=C, no_embed_class=True, init_values=0.5).eval()
    _randomise(base)
    g = torch.Generator().manual_seed(2)
    freqs = torch.randn(2, depth, heads * d // 2, generator=g) * 0.5 if mixed else None
    return base, freqs


def _rope_forward(base: VisionTransformer, freqs: torch.Tensor | None, x: torch.Tensor, *, mixed: bool, ape: bool,
                  rec: list | None = None) -> torch.Tensor:
    """naver-ai/rope-vit's `rope_vit_models.forward_features` and head on `x` of any size, written out: the table
    (patches only) resampled where the token count differs (`F.interpolate(mode='bicubic', align_corners=False)`,
    no antialiasing), the rotations recomputed for the input's grid (`init_t_xy(end_x=W // p, end_y=H // p)`)."""
    D, heads, p = base.embed_dim, base.blocks[0].attn.num_heads, base.patch_embed.patch_size[0]
    d, G = D // heads, base.patch_embed.grid_size
    B, _, H, W = x.shape
    t = base.patch_embed(x) if (H // p, W // p) == tuple(G) else base.patch_embed.proj(x).flatten(2).transpose(1, 2)
    if ape:
        pos = base.pos_embed
        if pos.shape[-2] != t.shape[-2]:
            pos = pos.view(1, G[1], G[0], D).permute(0, 3, 1, 2)
            pos = F.interpolate(pos, size=(H // p, W // p), mode="bicubic", align_corners=False)
            pos = pos.permute(0, 2, 3, 1).flatten(1, 2)
        t = t + pos
    t = torch.cat((base.cls_token.expand(B, -1, -1), t), 1)
    if mixed:
        t_x, t_y = _t_xy(W // p, H // p)
        cis_all = _mixed_cis(freqs, t_x, t_y, heads)
    for i, blk in enumerate(base.blocks):
        cis = cis_all[i] if mixed else _axial_cis(d, W // p, H // p)
        y = blk.norm1(t)
        _, N, _ = y.shape
        q, k, v = blk.attn.qkv(y).reshape(B, N, 3, heads, d).permute(2, 0, 3, 1, 4)
        q, k = q.clone(), k.clone()
        q[:, :, 1:], k[:, :, 1:] = _rotate(q[:, :, 1:], cis), _rotate(k[:, :, 1:], cis)
        a = ((q * d ** -0.5) @ k.transpose(-2, -1)).softmax(-1)
        if rec is not None:
            rec.append(a)
        t = t + blk.ls1(blk.attn.proj((a @ v).transpose(1, 2).reshape(B, N, D)))
        t = t + blk.ls2(blk.mlp(blk.norm2(t)))
    return base.head(base.norm(t)[:, 0])


def _rope_state_dict(base: VisionTransformer, freqs: torch.Tensor | None, ape: bool) -> dict[str, torch.Tensor]:
    """RoPE-ViT's (facebookresearch/deit models_v2) key names, with the training grid's `freqs_t_x/y` buffers."""
    sd = {}
    for k, v in base.state_dict().items():
        k = k.replace(".ls1.gamma", ".gamma_1").replace(".ls2.gamma", ".gamma_2")
        if k == "pos_embed" and not ape:
            continue
        sd[k] = v.contiguous()
    if freqs is not None:
        G = base.patch_embed.grid_size
        sd["freqs"] = freqs
        sd["freqs_t_x"], sd["freqs_t_y"] = _t_xy(G[1], G[0])
    return sd


def rope_case(mixed: bool, ape: bool) -> dict[str, torch.Tensor]:
    base, freqs = _rope_model(mixed, ape)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    rec: list = []
    with torch.no_grad():
        logits = _rope_forward(base, freqs, x, mixed=mixed, ape=ape, rec=rec)
    out = {f"sd.{k}": v for k, v in _rope_state_dict(base, freqs, ape).items()}
    out.update({"x": x, "logits": logits, **{f"attn.{i}": a for i, a in enumerate(rec)}})
    return out


# ----------------------------------------------------------------------------- timm layouts of other families
VIT = dict(img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=7)   # head dim 8
SWIN = dict(img_size=32, embed_dim=8, depths=(2, 2, 1), num_heads=(1, 2, 2), window_size=4, mlp_ratio=2.0,
            num_classes=5)   # grids 8, 4, 2: stage 0 shifted (8 > 4), stage 1 one window, stage 2 clamped to 2x2
DINO = dict(patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=7)   # head dim 16
FAMILY_CASES = {   # name -> (timm architecture, overrides, family the importer should report)
    "beit_layer_bias_mean": ("beit_base_patch16_224", dict(VIT, mlp_ratio=2.0), "timm-beit"),
    "beit_shared_bias_ape_token": ("beitv2_base_patch16_224",
                                   dict(VIT, mlp_ratio=2.0, use_abs_pos_emb=True, use_rel_pos_bias=False,
                                        use_shared_rel_pos_bias=True, global_pool="token", init_values=None),
                                   "timm-beit"),
    "swin_shift_clamped": ("swin_tiny_patch4_window7_224", dict(SWIN), "timm-swin"),
    "swinv2_shift_clamped": ("swinv2_tiny_window8_256", dict(SWIN), "timm-swinv2"),
    "swinv2_pretrained_windows": ("swinv2_tiny_window8_256", dict(SWIN, depths=(2, 2), num_heads=(1, 2),
                                                                  pretrained_window_sizes=(3, 2)), "timm-swinv2"),
    "clip_quickgelu": ("vit_base_patch16_clip_quickgelu_224", dict(VIT, mlp_ratio=2.0), "timm-clip"),
    "siglip_map_gelu_tanh": ("vit_base_patch32_siglip_256", dict(VIT, mlp_ratio=2.0), "timm-siglip"),
    "dinov2_giant_swiglu_packed": ("vit_giant_patch14_reg4_dinov2", dict(VIT, mlp_ratio=4.0),
                                   "timm"),   # SwiGLUPacked, SiLU
    # ref_feat_shape 3x3 on a 4x4 grid: positions scaled by 3/4, as eva02_*_336 (16x16 on 24x24)
    "eva02_tiny_336_style": ("eva02_tiny_patch14_336", dict(VIT, ref_feat_shape=(3, 3)), "timm-eva02"),
    # DINOv3 (`Eva`, rope_type 'dinov3': rotate-half pairs on normalised patch centres, temperature 100), 4
    # registers, LayerScale: plain GELU MLP and the mean of the patches (timm's default) on a 4x6 grid; SwiGLU
    # (separate fc1_g / fc1_x), query / value biases and the CLS read-out on 4x4
    "dinov3_small_reg4_nonsquare": ("vit_small_patch16_dinov3", dict(DINO, img_size=(32, 48)), "timm-dinov3"),
    "dinov3_small_plus_swiglu_qkvb_token": ("vit_small_plus_patch16_dinov3_qkvb",
                                            dict(DINO, img_size=32, global_pool="token"), "timm-dinov3"),
}


def _blocks(model: nn.Module) -> list[nn.Module]:
    """Every attention block in forward order (Swin: stage by stage)."""
    if hasattr(model, "layers"):
        return [blk for stage in model.layers for blk in stage.blocks]
    return list(model.blocks)


def family_case(arch: str, kwargs: dict) -> tuple[dict[str, torch.Tensor], dict]:
    import tempfile

    from timm.models._hub import save_config_for_hf
    model = timm.create_model(arch, pretrained=False, **kwargs).eval()
    _randomise(model)
    rec = _attn_recorder(_blocks(model))
    size = kwargs.get("img_size", model.pretrained_cfg["input_size"][1:])
    size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(x)
    with tempfile.TemporaryDirectory() as tmp:
        save_config_for_hf(model, f"{tmp}/config.json")
        config = json.loads(Path(f"{tmp}/config.json").read_text())
    out = {f"sd.{k}": v.contiguous() for k, v in model.state_dict().items()}
    out.update({"x": x, "logits": logits, **{f"attn.{i}": a for i, a in enumerate(rec)}})
    return out, {"class": type(model).__name__, "architecture": arch, "config": config, "input": list(size)}


def write_families() -> None:
    tensors, meta = {}, {}
    for name, (arch, kwargs, family) in FAMILY_CASES.items():
        torch.manual_seed(0)
        case, info = family_case(arch, kwargs)
        tensors.update({f"{name}.{k}": v for k, v in case.items()})
        meta[name] = {"family": family, "kwargs": kwargs, **info}
    save_file({k: v.contiguous().float() for k, v in tensors.items()}, str(OUT_FAMILIES),
              metadata={"cases": json.dumps(meta), "timm": timm.__version__, "torch": torch.__version__})
    print(f"wrote {OUT_FAMILIES} ({OUT_FAMILIES.stat().st_size / 1e3:.0f} kB, {len(meta)} cases)")


# ----------------------------------------------------------------------------- timm layouts at other sizes
# name -> (timm architecture, overrides at the native size, family, other sizes {tag: (H, W)}): one small case per
# timm-layout family (plain ViT twice: CLS + table with its row; registers + a patches-only, non-square table; BEiT
# twice: per-layer tables; shared + pos_embed), each at a larger square size and a rectangular one (one side shrinks;
# Swin: twice its size, and a rectangle vitpe refuses at import but runs). The state dict is stored again here (the
# file stands alone); the cases of FAMILY_CASES are built as there, with the same weights.
SIZE_CASES = {
    "timm_cls": ("vit_base_patch16_224", dict(VIT, mlp_ratio=2.0), "timm", {"sq": (48, 48), "rect": (24, 40)}),
    "timm_reg4_noembed_ls_nonsquare": ("vit_base_patch16_224",
                                       dict(VIT, img_size=(24, 40), mlp_ratio=2.0, reg_tokens=4, no_embed_class=True,
                                            init_values=0.5), "timm", {"sq": (40, 40), "rect": (32, 24)}),
    **{name: (*FAMILY_CASES[name], sizes) for name, sizes in {
        "beit_layer_bias_mean": {"sq": (48, 48), "rect": (24, 40)},
        "beit_shared_bias_ape_token": {"sq": (48, 48), "rect": (40, 24)},
        "clip_quickgelu": {"sq": (48, 48), "rect": (24, 40)},
        "siglip_map_gelu_tanh": {"sq": (48, 48), "rect": (24, 40)},
        "eva02_tiny_336_style": {"sq": (48, 48), "rect": (24, 40)},
        "dinov3_small_reg4_nonsquare": {"sq": (48, 48), "rect": (40, 24)},
        "swin_shift_clamped": {"sq": (64, 64), "rect": (32, 64)},
        "swinv2_shift_clamped": {"sq": (64, 64), "rect": (32, 64)},
    }.items()},
}


def _dynamic(model: nn.Module) -> bool:
    """Whether the model's class takes `dynamic_img_size` (timm's BEiT does not)."""
    import inspect
    return "dynamic_img_size" in inspect.signature(type(model).__init__).parameters


def size_case(arch: str, kwargs: dict, sizes: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """The native model's state dict and config.json, and for each other size an input and timm's logits by both
    of its paths: `filter` (the model created at that size, the native state dict through the model module's
    own `checkpoint_filter_fn`, with the source's model_args recorded as `create_model('local-dir:...')` does)
    and `dynamic` (the native model built with `dynamic_img_size=True`, run on the other size)."""
    import tempfile

    from timm.models._hub import save_config_for_hf
    native = timm.create_model(arch, pretrained=False, **kwargs).eval()
    _randomise(native)
    sd = {k: v.clone() for k, v in native.state_dict().items()}
    with tempfile.TemporaryDirectory() as tmp:
        save_config_for_hf(native, f"{tmp}/config.json")
        config = json.loads(Path(f"{tmp}/config.json").read_text())
    module = sys.modules[type(native).__module__]
    out = {f"sd.{k}": v.contiguous() for k, v in sd.items()}
    paths = ["filter"] + (["dynamic"] if _dynamic(native) else [])
    if "dynamic" in paths:
        dyn = timm.create_model(arch, pretrained=False, **kwargs, dynamic_img_size=True).eval()
        dyn.load_state_dict(sd)
    for tag, size in sizes.items():
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1)).half()   # stored as float16, exactly
        target = timm.create_model(arch, pretrained=False, **{**kwargs, "img_size": size}).eval()
        target.pretrained_model_args = dict(config.get("model_args") or {})
        missing, unexpected = target.load_state_dict(module.checkpoint_filter_fn(dict(sd), target), strict=False)
        assert not unexpected and all("relative_position_index" in k for k in missing), (missing, unexpected)
        with torch.no_grad():
            out[f"x.{tag}"] = x
            out[f"filter.{tag}"] = target(x.float())
            if "dynamic" in paths:
                out[f"dynamic.{tag}"] = dyn(x.float())
    return out, {"class": type(native).__name__, "module": module.__name__, "config": config, "paths": paths,
                 "sizes": {tag: list(size) for tag, size in sizes.items()}}


def write_sizes() -> None:
    tensors, meta = {}, {}
    for name, (arch, kwargs, family, sizes) in SIZE_CASES.items():
        torch.manual_seed(0)
        case, info = size_case(arch, kwargs, sizes)
        tensors.update({f"{name}.{k}": v for k, v in case.items()})
        meta[name] = {"family": family, "architecture": arch, "kwargs": kwargs, **info}
    save_file({k: v.contiguous() if v.dtype == torch.float16 else v.contiguous().float() for k, v in tensors.items()},
              str(OUT_SIZES),
              metadata={"cases": json.dumps(meta), "timm": timm.__version__, "torch": torch.__version__})
    print(f"wrote {OUT_SIZES} ({OUT_SIZES.stat().st_size / 1e3:.0f} kB, {len(meta)} cases)")


# ----------------------------------------------------------------------------- RoPE-ViT at its own size and others
# timm's port of naver-ai/rope-vit (`Eva` with attn_type 'rope', rope_grid_indexing 'xy', no grid offset; axial:
# RotaryEmbeddingCat, temperature 100; mixed: RotaryEmbeddingMixed's learned `rope.freqs`; `*_ape_*`: a patches-only
# table, no_embed_class) by both of timm's paths, as SIZE_CASES; one case on a non-square grid. And the original
# (written out above from its published code) on the same sizes, its table resampled as its forward does.
ROPE_SIZES = {"native": (32, 32), "sq": (48, 48), "rect": (24, 40)}   # the original's cases: 4x4, 6x6, 3x5 patches
PORT = dict(patch_size=4, embed_dim=24, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=7)   # head dim 12: d/4 = 3
PORT_SIZES = {"native": (16, 16), "sq": (24, 24), "rect": (12, 20)}   # 4x4, 6x6, 3x5 patches
PORT_CASES = {   # name -> (timm architecture, overrides, sizes {tag: (H, W)}, the native size among them)
    "port_axial": ("vit_base_patch16_rope_224", dict(PORT, img_size=16), PORT_SIZES),
    "port_axial_ape": ("vit_small_patch16_rope_ape_224", dict(PORT, img_size=16), PORT_SIZES),
    "port_mixed": ("vit_small_patch16_rope_mixed_224", dict(PORT, img_size=16), PORT_SIZES),
    "port_mixed_ape_nonsquare": ("vit_base_patch16_rope_mixed_ape_224", dict(PORT, img_size=(12, 20)),
                                 {"native": (12, 20), "sq": (20, 20), "rect": (16, 12)}),
}


def original_rope_case(mixed: bool, ape: bool, sizes: dict) -> dict[str, torch.Tensor]:
    """The first file's RoPE-ViT model (same weights), run by its original forward at each size on a float16 input."""
    base, freqs = _rope_model(mixed, ape)
    out = {f"sd.{k}": v for k, v in _rope_state_dict(base, freqs, ape).items()}
    for tag, size in sizes.items():
        x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1)).half()   # stored exactly
        with torch.no_grad():
            out[f"x.{tag}"] = x
            out[f"original.{tag}"] = _rope_forward(base, freqs, x.float(), mixed=mixed, ape=ape)
    return out


def write_rope() -> None:
    tensors, meta = {}, {}
    for name, (arch, kwargs, sizes) in PORT_CASES.items():
        torch.manual_seed(0)
        case, info = size_case(arch, kwargs, sizes)
        tensors.update({f"{name}.{k}": v for k, v in case.items()})
        meta[name] = {"family": "timm-rope-vit", "architecture": arch, "kwargs": kwargs, **info}
    for mixed in (False, True):
        for ape in (False, True):
            name = f"original_{'mixed' if mixed else 'axial'}{'_ape' if ape else ''}"
            torch.manual_seed(0)
            tensors.update({f"{name}.{k}": v for k, v in original_rope_case(mixed, ape, ROPE_SIZES).items()})
            meta[name] = {"family": "rope-vit", "mixed": mixed, "ape": ape, "heads": 2, "paths": ["original"],
                          "sizes": {tag: list(size) for tag, size in ROPE_SIZES.items()}}
    save_file({k: v.contiguous() if v.dtype == torch.float16 else v.contiguous().float() for k, v in tensors.items()},
              str(OUT_ROPE),
              metadata={"cases": json.dumps(meta), "timm": timm.__version__, "torch": torch.__version__})
    print(f"wrote {OUT_ROPE} ({OUT_ROPE.stat().st_size / 1e3:.0f} kB, {len(meta)} cases)")


def main() -> None:
    """All three files; `--only timm-families` writes the second one alone (the first one's logits move
    by an ulp between CPUs, so a rerun elsewhere would rewrite it without need), `--only sizes` the third,
    `--only rope` the RoPE-ViT file (written by that mode alone)."""
    set_fused_attn(False)
    only = sys.argv[2] if sys.argv[1:2] == ["--only"] and len(sys.argv) == 3 else None
    if sys.argv[1:] and only not in ("timm-families", "sizes", "rope"):
        sys.exit("usage: make_import_references.py [--only timm-families|sizes|rope]")
    if only == "sizes":
        write_sizes()
        return
    if only == "rope":
        write_rope()
        return
    write_families()
    if only == "timm-families":
        return
    write_sizes()
    tensors, meta = {}, {}
    for name, (cls, kwargs, size) in TIMM_CASES.items():
        torch.manual_seed(0)
        for k, v in timm_case(cls, kwargs, size).items():
            tensors[f"{name}.{k}"] = v
        meta[name] = {"family": "timm", "class": cls.__name__, "kwargs": {k: v for k, v in kwargs.items()},
                      "input": list(size)}
    for mixed in (False, True):
        for ape in (False, True):
            name = f"ropevit_{'mixed' if mixed else 'axial'}{'_ape' if ape else ''}"
            torch.manual_seed(0)
            for k, v in rope_case(mixed, ape).items():
                tensors[f"{name}.{k}"] = v
            meta[name] = {"family": "rope-vit", "mixed": mixed, "ape": ape, "input": [32, 32]}
    g = torch.Generator().manual_seed(3)
    for name, (rows, prefix, old, new) in {"resample_prefix1": (17, 1, (4, 4), (6, 5)),
                                           "resample_prefix0": (16, 0, (4, 4), (3, 7)),
                                           "resample_prefix5_shrink": (5 + 36, 5, (6, 6), (4, 4))}.items():
        pos = torch.randn(1, rows, 8, generator=g)
        tensors[f"{name}.in"] = pos
        tensors[f"{name}.out"] = resample_abs_pos_embed(pos, list(new), list(old), num_prefix_tokens=prefix)
        meta[name] = {"prefix": prefix, "old": list(old), "new": list(new)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous().float() for k, v in tensors.items()}, str(OUT),
              metadata={"cases": json.dumps(meta), "timm": timm.__version__, "torch": torch.__version__})
    print(f"wrote {OUT} ({OUT.stat().st_size / 1e3:.0f} kB, {len(meta)} cases)")


if __name__ == "__main__":
    main()
