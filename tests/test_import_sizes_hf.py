"""Hugging Face imports at another input size give what transformers gives at that size (issue 46,
Hugging Face half).

Tiny random models built by transformers itself (the helpers of test_importers_families.py and
test_swin.py), written with `save_pretrained`, imported, and compared at a larger square size and a
rectangular one with transformers at that size: `model(pixel_values, interpolate_pos_encoding=True)`
where the forward has the flag (ViT, BEiT, data2vec-vision, CLIP, SigLIP, Swin), the plain forward
where the family resizes by itself (DINOv2 with and without registers always resamples its table;
DINOv3's rotary positions fit any grid; Swin-V2's CPB any window). Two paths:

* `run`: the import at the config's size, run on the other size (the `ape` encoding resamples its
  table at run time with the family's rule: `ape_interpolation` / `ape_antialias`; BEiT's offset
  tables resize bilinearly; a Swin decides its windows per call, a Swin-V2 keeps its built ones);
* `import`: the import with `img_size=` that size (the tables resampled once, at import).

Both within 1e-5 relative (logits or pooled output, and every layer's attention weights), except
where a note names the difference: Swin-V2 imported for another size is the model transformers
builds for that size (`image_size=`, windows fixed when built), which the note tells apart from the
config's model run there; a table resampled at import is resampled again at yet another input size.
"""
from __future__ import annotations

import copy
import inspect
from pathlib import Path

import pytest
import torch

from vitpe_core.checkpoint import load_checkpoint, save_checkpoint
from vitpe_core.importers import import_file, import_state_dict
from vitpe_core.swin import SwinConfig

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (requirements-dev.txt)")

from test_importers_families import build, save               # noqa: E402  (after the skip: they need transformers)
from test_swin import hf_model, hf_outputs, ours, saved        # noqa: E402

REL = 1e-5
VIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
           patch_size=8, num_labels=5)
# name: (test_importers_families case, or a builder here; the family detected)
VIT_CASES = {
    "hf_vit": ("hf_vit", "hf"),
    "beit_layer_tables": ("beit_layer_bias_mean", "beit"),
    "beit_shared_table_ape": ("beit_shared_bias_ape_cls", "beit"),
    "data2vec_vision": ("data2vec_vision", "data2vec-vision"),
    "dinov2": ("dinov2_classifier", "dinov2"),
    "dinov2_registers": ("dinov2_registers_classifier", "dinov2"),
    "dinov3": ("dinov3", "dinov3"),
    "clip": ("clip_vision", "clip"),
    "clip_whole": ("clip_whole", "clip"),
    "siglip": ("siglip_vision_map", "siglip"),
}
SIZES = {"square": (48, 48), "rect": (24, 40)}          # native 32x32 (a 4x4 grid of 8-px patches)
DINOV3_SIZES = {"square": (48, 48), "rect": (40, 24)}   # native 24x40
# name: (version, test_swin.hf_model options); native 32x32 (an 8x8 grid of 4-px patches)
SWIN_CASES = {
    "swin": (1, dict(image_size=32, window_size=2)),
    "swin_ape": (1, dict(image_size=32, window_size=2, use_absolute_embeddings=True)),
    "swinv2": (2, dict(image_size=32, window_size=4)),          # stage 2: one 4x4 window built, unshifted
    "swinv2_pretrained": (2, dict(image_size=32, window_size=2, pretrained_window_sizes=[3, 3])),
}
SWIN_SIZES = {"square": (64, 64), "rect": (32, 56)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


def _hf_vit():
    config = transformers.ViTConfig(**VIT)
    torch.manual_seed(0)
    model = transformers.ViTForImageClassification._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def _model(case: str):
    src = VIT_CASES[case][0]
    return _hf_vit() if src == "hf_vit" else build(src)


def transformers_at(model, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """transformers at `x`'s size: the forward with `interpolate_pos_encoding=True` where it has the
    flag, else the plain one (the family resizes by itself); output (logits or pooled) and attentions."""
    if isinstance(model, (transformers.CLIPModel, transformers.SiglipModel)):
        model = model.vision_model
    flag = "interpolate_pos_encoding" in inspect.signature(model.forward).parameters
    with torch.no_grad():
        out = model(pixel_values=x, output_attentions=True, **({"interpolate_pos_encoding": True} if flag else {}))
    return (out.logits if hasattr(out, "logits") else out.pooler_output), list(out.attentions)


def vitpe_vs(imported, ref: tuple[torch.Tensor, list[torch.Tensor]], x: torch.Tensor) -> float:
    """The largest relative error of the output (trace and fast path) and of every layer's attention."""
    rec: list[dict] = []
    with torch.no_grad():
        out = imported(x, trace=rec)
        fast = imported(x)
    main, attentions = ref
    assert len(rec) == len(attentions)
    return max([_rel(out, main), _rel(fast, main)] + [_rel(r["attn"], a) for r, a in zip(rec, attentions)])


def _x(size: tuple[int, int], seed: int = 3) -> torch.Tensor:
    return torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- the ViT families
@pytest.fixture(scope="module")
def vit_models(tmp_path_factory):
    """Each case's transformers model and its `save_pretrained` file, built once."""
    root = tmp_path_factory.mktemp("hf_sizes")
    return {case: (model := _model(case), save(model, root / case)) for case in VIT_CASES}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("case", list(VIT_CASES))
def test_a_vit_family_at_another_size_equals_transformers_there(case, size, vit_models):
    model, path = vit_models[case]
    hw = (DINOV3_SIZES if case == "dinov3" else SIZES)[size]
    x = _x(hw)
    ref = transformers_at(model, x)
    native = import_file(path)
    assert native.family == VIT_CASES[case][1]
    assert native.model.cfg.img_size != hw
    err = vitpe_vs(native.model, ref, x)
    assert err <= REL, f"{case} run at {hw}: relative error {err:.2e}"
    at = import_file(path, img_size=hw)
    assert at.model.cfg.img_size == hw
    err = vitpe_vs(at.model, ref, x)
    assert err <= REL, f"{case} imported for {hw}: relative error {err:.2e}"
    if "ape" in at.model.cfg.encoding.split("+"):   # resampled once: yet another size says so in one line
        assert sum("resamples its" in n and "again" in n for n in at.notes) == 1, at.notes


@pytest.mark.parametrize("case, antialias", [("hf_vit", False), ("beit_shared_table_ape", False), ("dinov2", False),
                                             ("dinov2_registers", True), ("clip", False), ("siglip", False)])
def test_each_import_records_its_librarys_resampling_rule(case, antialias, vit_models, tmp_path):
    """The rule is the `ape` part's options in the config, and a vitpe checkpoint keeps it; a
    checkpoint without options (every one written before them) resamples as timm, antialiased."""
    imp = import_file(vit_models[case][1])
    options = imp.model.cfg.encoding_options
    assert {k: options[k] for k in ("ape_interpolation", "ape_antialias")} == {"ape_interpolation": "bicubic",
                                                                                "ape_antialias": antialias}
    if case == "beit_shared_table_ape":
        assert options["shared"] is True and imp.model.cfg.encoding == "rpb_cls+ape"
    ckpt = load_checkpoint(save_checkpoint(tmp_path / "m.safetensors", imp.model, dtype=torch.float32))
    assert ckpt.model.cfg.encoding_options == options
    x = _x((48, 48))
    with torch.no_grad():
        torch.testing.assert_close(ckpt.model(x), imp.model(x), rtol=1e-6, atol=1e-6)


def test_an_ape_without_options_resamples_as_before_with_timms_rule():
    """Checkpoints written before the options (none in their config) keep timm's rule bit for bit:
    bicubic, antialiased; the options reach `ape` inside a composite and are checked when built."""
    from vitpe_core.encodings import EncodingContext, build_encoding
    from vitpe_core.encodings.absolute import resample_abs_pos_embed
    ctx = EncodingContext(dim=8, heads=2, depth=2, grid=(4, 4))
    plain = build_encoding("ape", ctx)
    torch.manual_seed(0)
    torch.nn.init.normal_(plain.pos_embed)
    for grid in ((6, 6), (3, 5), (4, 4)):
        assert torch.equal(plain.table(grid), resample_abs_pos_embed(plain.pos_embed, grid, (4, 4), 1)[0])
    hf = build_encoding("rpb_cls+ape", ctx, shared=True, ape_antialias=False)
    hf.parts[1].pos_embed.data.copy_(plain.pos_embed)
    expect = resample_abs_pos_embed(plain.pos_embed, (6, 6), (4, 4), 1, antialias=False)[0]
    assert torch.equal(hf.parts[1].table((6, 6)), expect) and not torch.equal(expect, plain.table((6, 6)))
    for bad in ({"ape_interpolation": "lanczos"}, {"ape_interpolation": "nearest", "ape_antialias": True},
                {"ape_antialias": "no"}):
        with pytest.raises(ValueError):
            build_encoding("ape", ctx, **bad)


def test_a_table_resampled_at_import_is_resampled_again_at_yet_another_size(vit_models):
    """What the note says: imported for 48 px, run at 24x40, the table is the 6x6 one resampled, not
    the trained 4x4 one; transformers resamples the trained one (so do imports at the config's size)."""
    model, path = vit_models["clip"]
    at48 = import_file(path, img_size=(48, 48))
    x = _x((24, 40))
    ref = transformers_at(model, x)
    assert vitpe_vs(import_file(path).model, ref, x) <= REL
    assert vitpe_vs(at48.model, ref, x) > 1e-4
    assert any("import at 32x32 to run at every size" in n for n in at48.notes)


# ----------------------------------------------------------------------------- Swin, Swin-V2
@pytest.fixture(scope="module")
def swin_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("swin_sizes")
    out = {}
    for case, (version, options) in SWIN_CASES.items():
        hf = hf_model(version, **options)
        sd, config = saved(hf, root / case)
        out[case] = (hf, sd, config)
    return out


def swin_at(hf, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """transformers' Swin at `x`'s size, fresh: its Swin layers keep a window they shrank for an
    earlier, smaller input (`set_shift_and_window_size` overwrites it), so each size gets a copy
    never run before, as `from_pretrained` gives. Every block's attention weights."""
    hf = copy.deepcopy(hf)
    if getattr(hf.config, "use_absolute_embeddings", False):   # its table: interpolate_pos_encoding=True
        forward = hf.forward
        hf.forward = lambda *a, **kw: forward(*a, interpolate_pos_encoding=True, **kw)
    return hf_outputs(hf, x)


def swin_vs(model, ref: tuple[torch.Tensor, list[torch.Tensor]], x: torch.Tensor) -> float:
    out, trace = ours(model, x)
    main, attentions = ref
    assert len(trace) == len(attentions)
    return max([_rel(out, main)] + [_rel(t["attn"].flatten(0, 1), a) for t, a in zip(trace, attentions)])


@pytest.mark.parametrize("size", list(SWIN_SIZES))
@pytest.mark.parametrize("case", list(SWIN_CASES))
def test_a_swin_at_another_size_equals_transformers_there(case, size, swin_models):
    hf, sd, config = swin_models[case]
    version = SWIN_CASES[case][0]
    hw = SWIN_SIZES[size]
    x = _x(hw)
    ref = swin_at(hf, x)
    native = import_state_dict(sd, hf_config=config)
    err = swin_vs(native.model, ref, x)
    assert err <= REL, f"{case} run at {hw}: relative error {err:.2e}"
    at = import_state_dict(sd, hf_config=config, img_size=hw)
    assert at.model.cfg.img_size == hw
    if version == 1:   # Swin decides its windows per call: the same model
        err = swin_vs(at.model, ref, x)
        assert err <= REL, f"{case} imported for {hw}: relative error {err:.2e}"
        return
    # Swin-V2 fixes its windows when built: imported for hw it is transformers' model built for hw
    built = (transformers.Swinv2ForImageClassification)(
        transformers.Swinv2Config(**{**config, "image_size": list(hw)}, attn_implementation="eager")).eval()
    built.load_state_dict(hf.state_dict())
    err = swin_vs(at.model, swin_at(built, x), x)
    assert err <= REL, f"{case} imported for {hw} vs transformers built for it: relative error {err:.2e}"
    differs = (at.model.cfg.stage_windows, at.model.cfg.stage_shifts) != (native.model.cfg.stage_windows,
                                                                          native.model.cfg.stage_shifts)
    noted = [n for n in at.notes if n.startswith("Swin-V2 fixes its windows when built")]
    assert len(noted) == differs, at.notes
    gap = swin_vs(at.model, ref, x)
    assert (gap > 1e-4) == differs, gap


def test_swinv2_at_an_odd_grid_builds_transformers_windows(tmp_path):
    """Hugging Face's Swin-V2 decides a stage's window on `image_size // patch // 2**s` rounded down
    (`Swinv2Encoder`): a 9x9 grid's second stage is 4 tokens high (one 4x4 window, unshifted) where
    the padded grid would give 5 (shifted 4x4 windows). Equal at its own size and at others."""
    hf = hf_model(2, image_size=36, window_size=4)
    sd, config = saved(hf, tmp_path)
    imp = import_state_dict(sd, hf_config=config)
    assert (imp.model.cfg.stage_windows, imp.model.cfg.stage_shifts) == ((4, 4), (2, 0))
    for hw in ((36, 36), (64, 64), (36, 52)):
        x = _x(hw)
        assert swin_vs(imp.model, swin_at(hf, x), x) <= REL, hw
    assert SwinConfig(version=2, img_size=(36, 36), window_size=4, depths=(2, 2), num_heads=(2, 4),
                      embed_dim=16).stage_windows == (4, 4)


def test_a_swin_absolute_table_imported_for_another_size_is_resampled_with_a_note(swin_models):
    hf, sd, config = swin_models["swin_ape"]
    imp = import_state_dict(sd, hf_config=config, img_size=(64, 64))
    assert imp.model.absolute_pos_embed.shape == (1, 256, 16)
    assert any("absolute table was trained on a 8x8 grid; resampled to 16x16" in n for n in imp.notes)


def test_docs_say_how_hugging_face_imports_meet_other_sizes():
    text = (Path(__file__).resolve().parents[1] / "docs" / "importing.md").read_text()
    assert "interpolate_pos_encoding" in text and "ape_antialias" in text
