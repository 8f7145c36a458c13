"""RoPE-ViT at its own size and at others (issue 46): timm's port and the original import exactly.

Against tests/data/import_references_rope.safetensors (scripts/make_import_references.py `--only rope`,
run in a side environment with timm 1.0.31):

* timm's port of naver-ai/rope-vit (`Eva`, `vit_*_patch16_rope_*`: axial and mixed, with and without
  a table, one on a non-square grid), its state dict and the `config.json` timm writes for it, and at
  its own size, a larger square and a rectangle an input and timm's logits by its two paths: `filter`
  (the model created at that size, the state dict through `eva.checkpoint_filter_fn`) -- vitpe's
  import with `img_size=`; `dynamic` (`dynamic_img_size=True`) -- vitpe's import at its own size run
  on that input. Imported from its folder without a flag (family `timm-rope-vit`).
* the original (naver-ai/rope-vit's `rope_vit_models`, written out from its published code in that
  script; the weights of tests/data/import_references.safetensors' `ropevit_*` cases) run by its own
  forward at those sizes: its table resampled bicubically without antialiasing, its rotations
  recomputed for the grid. Imported from its state dict (family `rope-vit`), at that size and at its
  own, both held to the original's logits.

Every path within 1e-5 relative (trace and fast path); the table's rule is shown to matter at the
rectangle (one side shrinks), where the other library's rule misses by far more.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vitpe_core.__main__ import main
from vitpe_core.checkpoint import CheckpointError, load_checkpoint
from vitpe_core.encodings import EncodingContext, build_encoding
from vitpe_core.encodings.absolute import LearnedAbsolute
from vitpe_core.importers import detect_family, import_file, import_state_dict

REFS = Path(__file__).parent / "data" / "import_references_rope.safetensors"
if not REFS.exists():
    pytest.skip(f"{REFS.name} is missing: run scripts/make_import_references.py --only rope in a side environment "
                "with timm 1.0.31 (the script's docstring has the commands)", allow_module_level=True)

REL = 1e-5

from test_importers import _refs, case_folder, case_state_dict   # noqa: E402  (after the skip)

META, CASES = _refs(REFS)
PORT = [c for c in META if META[c]["family"] == "timm-rope-vit"]
ORIGINAL = [c for c in META if META[c]["family"] == "rope-vit"]
HEADS = 2   # the original's state dict does not record its heads (its released models: width / 64, the default)
ENCODINGS = {"port_axial": "rope_axial", "port_axial_ape": "rope_axial+ape", "port_mixed": "rope_mixed",
             "port_mixed_ape_nonsquare": "rope_mixed+ape", "original_axial": "rope_axial",
             "original_axial_ape": "rope_axial+ape", "original_mixed": "rope_mixed",
             "original_mixed_ape": "rope_mixed+ape"}


def _sd(case: str) -> dict[str, torch.Tensor]:
    return case_state_dict(CASES, case)


def _folder(case: str, tmp_path: Path, config: dict | None = None, sd: dict | None = None) -> Path:
    return case_folder(META, CASES, case, tmp_path, config, sd)


def _size(case: str, tag: str) -> tuple[int, int]:
    return tuple(META[case]["sizes"][tag])


def _original(case: str, img_size: tuple[int, int] | None = None):
    """The original's import from its state dict: the size is its own where not given (its table, or the
    native size where it has none: a state dict without a table does not record a grid)."""
    family = "rope-vit" if case == "original_axial_ape" else "auto"   # DeiT-III names + table: the user says which
    return import_state_dict(_sd(case), heads=HEADS, family=family, img_size=img_size or _size(case, "native"))


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = REL) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()
    assert err <= rel, f"max relative difference {err:.3g}"
    return err


def _check(model, case: str, tag: str, ref: str, rel: float = REL) -> float:
    """The trace's and the fast path's logits on the case's input at `tag` against `ref.tag`."""
    x = CASES[case][f"x.{tag}"].float()   # stored as float16: timm and the original ran on exactly these values
    with torch.no_grad():
        traced = model(x, trace=[])
        fast = model(x)
    return max(_close(traced, CASES[case][f"{ref}.{tag}"], rel), _close(fast, CASES[case][f"{ref}.{tag}"], rel))


def _cases(names: list[str]) -> list[tuple[str, str]]:
    return [(case, tag) for case in names for tag in META[case]["sizes"]]


# ----------------------------------------------------------------------------- timm's port
@pytest.mark.parametrize("case, tag", _cases(PORT))
def test_the_port_imported_at_a_size_equals_timms_model_created_at_it(case, tag, tmp_path):
    """From its hub folder without a flag: the architecture in timm's config.json decides the family, its
    model_args the heads and the size; `img_size=` resamples the table as timm's checkpoint filter does."""
    h, w = _size(case, tag)
    imp = import_file(_folder(case, tmp_path), img_size=f"{h}x{w}")
    cfg = imp.model.cfg
    assert (imp.family, cfg.encoding, cfg.grid) == ("timm-rope-vit", ENCODINGS[case], (h // 4, w // 4))
    _check(imp.model, case, tag, "filter")
    assert not [n for n in imp.notes if "differ" in n], imp.notes


@pytest.mark.parametrize("case, tag", _cases(PORT))
def test_the_ports_native_import_run_at_each_size_equals_timms_dynamic_size(case, tag, tmp_path):
    imp = import_file(_folder(case, tmp_path))
    assert imp.family == "timm-rope-vit" and imp.model.cfg.img_size == _size(case, "native")
    _check(imp.model, case, tag, "dynamic")


def test_the_ports_config_maps_timms_rotary_embedding(tmp_path):
    """Axial: rope_axial with timm's temperature and its rounding of the frequencies; mixed: timm's
    `rope.freqs (2, depth, heads, d/2)` as rope_freqs (depth, 2, heads, d/2), no channel reordered; the table
    keeps timm's (antialiased) rule; the eval transform is timm's pretrained_cfg."""
    axial = import_file(_folder("port_axial_ape", tmp_path))
    cfg = axial.model.cfg
    assert (cfg.encoding_options, cfg.no_embed_class, cfg.heads, cfg.pool) == (
        {"theta": 100.0, "reciprocal": True}, True, 2, "token")
    assert axial.preprocess == {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "crop_pct": 0.9,
                                "interpolation": "bicubic"}
    mixed = import_file(_folder("port_mixed", tmp_path))
    assert mixed.model.cfg.encoding_options == {}
    freqs = _sd("port_mixed")["rope.freqs"]
    assert torch.equal(mixed.model.pos_enc.rope_freqs.detach(), freqs.permute(1, 0, 2, 3))
    sd = _sd("port_mixed")
    assert torch.equal(mixed.model.blocks[0].attn.qkv.weight.detach(), sd["blocks.0.attn.qkv.weight"])


def test_the_ports_table_rule_is_timms_and_it_matters_at_the_rectangle(tmp_path):
    """Rows shrink from 4 to 3 there: without antialiasing (the original's rule) the logits miss timm's."""
    case = "port_axial_ape"
    model = import_file(_folder(case, tmp_path)).model
    ape = next(m for m in model.modules() if isinstance(m, LearnedAbsolute))
    assert (ape.interpolation, ape.antialias) == ("bicubic", True)
    ape.antialias = False
    with pytest.raises(AssertionError, match="max relative difference"):
        _check(model, case, "rect", "dynamic", rel=1e-3)


def test_a_stored_port_keeps_its_rules(tmp_path):
    """The options are in the stored config: the checkpoint run at other sizes still equals timm."""
    for case in ("port_axial_ape", "port_mixed_ape_nonsquare"):
        out = tmp_path / f"{case}.safetensors"
        assert main(["import", str(_folder(case, tmp_path)), "--out", str(out)]) == 0
        ckpt = load_checkpoint(out)
        assert ckpt.model.cfg.encoding == ENCODINGS[case]
        for tag in META[case]["sizes"]:
            _check(ckpt.model, case, tag, "dynamic")


def test_the_port_without_its_config(tmp_path):
    """The mixed port's `rope.freqs` says what it is (heads from its rows); the axial port's keys are the original
    RoPE-Axial's: read as `rope-vit`, which computes the same at the size it is imported at."""
    mixed = import_file(_folder("port_mixed", tmp_path, config={}))
    assert (mixed.family, mixed.model.cfg.heads, mixed.model.cfg.encoding) == ("timm-rope-vit", 2, "rope_mixed")
    _check(mixed.model, "port_mixed", "native", "dynamic")
    no_layer_scale = {k: v for k, v in _sd("port_mixed").items() if "gamma" not in k}
    assert detect_family(no_layer_scale) == "timm-rope-vit"   # not a timm ViT leaving `rope.*` out as foreign
    assert detect_family(_sd("port_axial")) == "rope-vit"
    axial = import_state_dict(_sd("port_axial"), heads=2, img_size=(16, 16))
    _check(axial.model, "port_axial", "native", "dynamic")
    _check(axial.model, "port_axial", "rect", "dynamic")


def _with_args(case: str, **args) -> dict:
    config = json.loads(json.dumps(META[case]["config"]))
    config["model_args"] = {**config["model_args"], **args}
    return config


@pytest.mark.parametrize("arg, value", [("rope_grid_offset", 1.0), ("rope_grid_indexing", "ij"),
                                        ("rope_rotate_half", True), ("ref_feat_shape", [4, 4]),
                                        ("attn_type", "eva"), ("num_reg_tokens", 1), ("use_post_norm", True)])
def test_port_settings_vitpe_does_not_compute_are_refused_by_name(arg, value, tmp_path):
    with pytest.raises(CheckpointError, match=f"timm-rope-vit: timm's config.json sets {arg}="):
        import_file(_folder("port_axial", tmp_path, config=_with_args("port_axial", **{arg: value})))


def test_the_port_refuses_another_rotary_embedding_or_keys_that_contradict_its_config(tmp_path):
    with pytest.raises(CheckpointError, match="rope_type='dinov3'"):
        import_file(_folder("port_axial", tmp_path, config=_with_args("port_axial", rope_type="dinov3")))
    config = dict(META["port_axial"]["config"], architecture="vit_small_patch16_rope_mixed_224")
    with pytest.raises(CheckpointError, match=r"says RoPE-Mixed, but the file lacks the learned frequencies"):
        import_file(_folder("port_axial", tmp_path, config=config))
    sd = {**_sd("port_axial"), "blocks.0.attn.q_norm.weight": torch.ones(12)}
    with pytest.raises(CheckpointError, match="blocks.0.attn.q_norm.weight is a norm inside attention"):
        import_file(_folder("port_axial", tmp_path, sd=sd))
    sd = {**_sd("port_axial"), "blocks.0.attn.extra": torch.zeros(2)}
    with pytest.raises(CheckpointError, match=r"timm-rope-vit keys vitpe cannot place.*blocks.0.attn.extra"):
        import_file(_folder("port_axial", tmp_path, sd=sd))


def test_timms_other_rope_models_stay_refused(tmp_path):
    """`vit_*_rope_reg*` (registers, grid offset 1, another temperature) is not the port: not this family."""
    config = dict(META["port_axial"]["config"], architecture="vit_base_patch16_rope_reg1_gap_256")
    sd = {**_sd("port_axial"), "reg_token": torch.zeros(1, 1, 24)}
    with pytest.raises(CheckpointError, match=r"timm-dinov3: .*it names 'vit_base_patch16_rope_reg1_gap_256'"):
        import_file(_folder("port_axial", tmp_path, config=config, sd=sd))


# ----------------------------------------------------------------------------- the original
@pytest.mark.parametrize("case, tag", _cases(ORIGINAL))
def test_the_original_imported_at_a_size_equals_its_forward_there(case, tag):
    imp = _original(case, _size(case, tag))
    assert (imp.family, imp.model.cfg.encoding) == ("rope-vit", ENCODINGS[case])
    _check(imp.model, case, tag, "original")


@pytest.mark.parametrize("case, tag", _cases(ORIGINAL))
def test_the_originals_native_import_run_at_each_size_equals_its_forward_there(case, tag):
    _check(_original(case).model, case, tag, "original")


def test_the_originals_table_rule_is_its_own_and_it_matters_at_the_rectangle():
    """naver-ai/rope-vit resamples with `F.interpolate(mode='bicubic', align_corners=False)`: recorded as the
    `ape` options (and used at import); timm's antialiased rule misses where rows shrink."""
    imp = _original("original_mixed_ape")
    assert imp.model.cfg.encoding_options == {"ape_interpolation": "bicubic", "ape_antialias": False}
    assert _original("original_axial_ape").model.cfg.encoding_options == {
        "ape_interpolation": "bicubic", "ape_antialias": False, "reciprocal": True}
    assert _original("original_axial").model.cfg.encoding_options == {"reciprocal": True}
    assert not [n for n in imp.notes if "antialias" in n]
    ape = next(m for m in imp.model.modules() if isinstance(m, LearnedAbsolute))
    ape.antialias = True
    with pytest.raises(AssertionError, match="max relative difference"):
        _check(imp.model, "original_mixed_ape", "rect", "original", rel=1e-3)
    at = _original("original_mixed_ape", _size("original_mixed_ape", "rect"))
    assert any("resampled to 3x5 (bicubic, not antialiased, as RoPE-ViT's forward does)" in n for n in at.notes)


def test_a_stored_original_keeps_its_rule(tmp_path):
    case = "original_axial_ape"
    path, out = tmp_path / "rope.safetensors", tmp_path / "ckpt.safetensors"
    save_file(_sd(case), str(path))
    assert main(["import", str(path), "--out", str(out), "--heads", "2", "--family", "rope-vit"]) == 0
    ckpt = load_checkpoint(out)
    for tag in META[case]["sizes"]:
        _check(ckpt.model, case, tag, "original")


def test_reciprocal_frequencies_are_rope_vits_rounding():
    """`reciprocal`: 1 / θ^(k/(d/4)), as naver-ai/rope-vit's compute_axial_cis and timm's freq_bands round it;
    the default θ^(−k/(d/4)) (every checkpoint written before the option) within an ulp of it."""
    ctx = EncodingContext(dim=64, heads=2, depth=1, grid=(3, 5))
    own, timms = build_encoding("rope_axial", ctx), build_encoding("rope_axial", ctx, reciprocal=True)
    n = 8
    assert torch.equal(timms.freqs, 1.0 / 100.0 ** (torch.arange(0, 4 * n, 4)[:n].float() / (4 * n)))
    assert torch.equal(own.freqs, 100.0 ** (-torch.arange(n, dtype=torch.float32) / n))
    torch.testing.assert_close(own.freqs, timms.freqs, rtol=2e-7, atol=0)
    with pytest.raises(ValueError, match="reciprocal must be true or false"):
        build_encoding("rope_axial", ctx, reciprocal="yes")
