"""timm's layouts of BEiT, Swin, Swin-V2, CLIP, SigLIP, DINOv2-g (packed SwiGLU), EVA-02 and DINOv3
import exactly.

Against vectors of timm 1.0.31 itself (scripts/make_import_references.py, run in a side
environment: timm cannot be installed beside the project's torch; tests/data/
import_references_timm_families.safetensors): tiny random-weight models built by
`timm.create_model` from real architecture names, their state dicts, the `config.json` timm writes
for them (`save_config_for_hf`), an input, the logits and every block's attention weights. Each
case, written as `model.safetensors` + `config.json` and imported by the library and by the CLI,
gives timm's logits and attention within 1e-5 relative in float32 and stays float32; what the keys
do not say and no config.json gives is asked for by its option (`--act`, `--window`), and what
vitpe does not compute is refused by the key that decides it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_importers import _refs, case_folder, case_state_dict
from vitpe_core.__main__ import main
from vitpe_core.checkpoint import CheckpointError, load_checkpoint
from vitpe_core.importers import detect_family, import_file, import_state_dict
from vitpe_core.importers import is_swin

REFS = Path(__file__).parent / "data" / "import_references_timm_families.safetensors"


META, CASES = _refs(REFS)
REL = 1e-5


def _sd(case: str) -> dict[str, torch.Tensor]:
    return case_state_dict(CASES, case)


def _folder(case: str, tmp_path: Path, config: dict | None = None, sd: dict | None = None) -> Path:
    return case_folder(META, CASES, case, tmp_path, config, sd)


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = REL) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    err = ((a - b).abs().max() / b.abs().max().clamp_min(1e-6)).item()
    assert err <= rel, f"max relative difference {err:.3g}"
    return err


def check(model, case: str) -> float:
    """The case's logits (trace and fast path) and every block's attention (Swin: per window)."""
    ref = CASES[case]
    rec: list[dict] = []
    with torch.no_grad():
        out = model(ref["x"], trace=rec)
        fast = model(ref["x"])
    errs = [_close(out, ref["logits"]), _close(fast, ref["logits"])]
    n = sum(1 for k in ref if k.startswith("attn."))
    assert len(rec) == n > 0
    for i, layer in enumerate(rec):
        theirs = ref[f"attn.{i}"]
        errs.append(_close(layer["attn"].reshape(theirs.shape), theirs))
    return max(errs)


@pytest.mark.parametrize("case", list(META))
def test_a_timm_folder_imports_exactly(case, tmp_path):
    imp = import_file(_folder(case, tmp_path))
    assert imp.family == META[case]["family"]
    assert imp.source_dtype == torch.float32
    check(imp.model, case)
    pre = META[case]["config"]["pretrained_cfg"]   # the eval transform timm's config.json records
    assert imp.preprocess["mean"] == pre["mean"] and imp.preprocess["crop_pct"] == pre["crop_pct"]


@pytest.mark.parametrize("case", list(META))
def test_the_cli_imports_a_timm_folder_and_stores_float32_as_float32(case, tmp_path, capsys):
    path = _folder(case, tmp_path)
    out = tmp_path / f"{case}.safetensors"
    assert main(["import", str(path), "--out", str(out)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["family"] == META[case]["family"] and line["stored_dtype"] == "float32"
    ckpt = load_checkpoint(out)
    assert ckpt.metrics["stored_dtype"] == ckpt.metrics["source_dtype"] == "float32"
    assert all(p.dtype == torch.float32 for p in ckpt.model.parameters())
    check(ckpt.model, case)
    half = tmp_path / "half.safetensors"
    assert main(["import", str(path), "--out", str(half), "--half"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["stored_dtype"] == "float16" and any("Stored as float16" in n for n in line["notes"])


def test_what_each_timm_family_becomes(tmp_path):
    cfg = {case: import_file(_folder(case, tmp_path)).model.cfg for case in META}
    assert (cfg["beit_layer_bias_mean"].encoding, cfg["beit_layer_bias_mean"].pool,
            cfg["beit_layer_bias_mean"].layer_scale) == ("rpb_cls", "avg", True)
    assert (cfg["beit_shared_bias_ape_token"].encoding, cfg["beit_shared_bias_ape_token"].encoding_options,
            cfg["beit_shared_bias_ape_token"].pool) == ("rpb_cls+ape", {"shared": True, "table_resize": "geometric"},
                                                        "token")   # timm's rule at other sizes (test_import_sizes_timm)
    c = cfg["clip_quickgelu"]
    assert (c.pre_norm, c.act, c.norm_eps, c.pool) == (True, "quick_gelu", 1e-5, "token")
    c = cfg["siglip_map_gelu_tanh"]
    assert (c.class_token, c.pool, c.act, c.norm_eps) == (False, "map", "gelu_tanh", 1e-6)
    c = cfg["dinov2_giant_swiglu_packed"]
    assert (c.mlp, c.act, c.reg_tokens, c.layer_scale, c.no_embed_class) == ("gated", "silu", 4, True, True)
    c = cfg["eva02_tiny_336_style"]
    assert (c.encoding, c.encoding_options, c.mlp, c.act) == ("rope_axial+ape", {"theta": 10000.0, "ref_grid": [3, 3]},
                                                              "gated", "silu")
    c = cfg["dinov3_small_reg4_nonsquare"]
    assert (c.encoding, c.encoding_options, c.grid, c.reg_tokens, c.layer_scale, c.pool, c.mlp, c.act, c.qkv_bias,
            c.norm_eps) == ("rope_dinov3", {"theta": 100.0}, (4, 6), 4, True, "avg", "mlp", "gelu", False, 1e-5)
    c = cfg["dinov3_small_plus_swiglu_qkvb_token"]
    assert (c.encoding, c.reg_tokens, c.pool, c.mlp, c.act, c.qkv_bias) == ("rope_dinov3", 4, "token", "gated", "silu",
                                                                            True)
    s = cfg["swin_shift_clamped"]
    assert (s.version, s.depths, s.num_heads, s.stage_windows, s.stage_shifts) == (1, (2, 2, 1), (1, 2, 2), (4, 4, 2),
                                                                                   (2, 0, 0))
    assert cfg["swinv2_pretrained_windows"].pretrained_window_sizes == (3, 2)


def test_detection_tells_timm_layouts_from_hugging_faces():
    assert detect_family(_sd("beit_layer_bias_mean")) == "timm-beit"
    assert detect_family(_sd("beit_shared_bias_ape_token")) == "timm-beit"
    assert detect_family(_sd("eva02_tiny_336_style"), META["eva02_tiny_336_style"]["config"]) == "timm-eva02"
    assert detect_family(_sd("clip_quickgelu")) == "timm"
    for case in ("dinov3_small_reg4_nonsquare", "dinov3_small_plus_swiglu_qkvb_token"):
        assert detect_family(_sd(case), META[case]["config"]) == "timm-dinov3"
        assert detect_family(_sd(case)) == "timm-dinov3"   # registers + `gamma_1`: timm's Eva (refused without config)
    assert is_swin(_sd("swin_shift_clamped")) and is_swin(_sd("swinv2_shift_clamped"))


@pytest.mark.slow
def test_a_timm_hub_id_reads_timms_config_json(tmp_path):
    """`python -m vitpe_core import timm/swinv2_tiny_window8_256.ms_in1k`: the hub's timm repositories
    hold `model.safetensors` and timm's `config.json`; offline here, against a cache laid out as a
    download leaves it."""
    case, repo = "swinv2_shift_clamped", "timm/swinv2_tiny_window8_256.ms_in1k"
    src = _folder(case, tmp_path).parent
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = tmp_path / "cache" / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    (base / "snapshots" / commit).mkdir(parents=True)
    for f in src.iterdir():
        (base / "snapshots" / commit / f.name).write_bytes(f.read_bytes())
    out = tmp_path / "swinv2.safetensors"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "cache"),
           "HF_HOME": str(tmp_path / "hf")}
    res = subprocess.run([sys.executable, "-m", "vitpe_core", "import", repo, "--out", str(out)], capture_output=True,
                         text=True, env=env, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["family"] == "timm-swinv2"
    ckpt = load_checkpoint(out)
    assert ckpt.metrics["source"] == repo and ckpt.metrics["preprocess"]["crop_pct"] == 0.9
    check(ckpt.model, case)


# ----------------------------------------------------------------------------- without timm's config.json
@pytest.mark.parametrize("case, act, layer", [("clip_quickgelu", "quick_gelu", "norm_pre.weight"),
                                             ("siglip_map_gelu_tanh", "gelu_tanh", "attn_pool."),
                                             ("dinov2_giant_swiglu_packed", "silu", "blocks.0.mlp.fc1.weight")])
def test_without_config_the_activation_is_asked_for_by_its_option(case, act, layer, tmp_path):
    path = _folder(case, tmp_path, config={})
    with pytest.raises(CheckpointError, match=r"activation is not in a state dict.*--act gelu\|gelu_tanh\|quick_gelu"):
        import_file(path)
    with pytest.raises(CheckpointError, match=layer):
        import_file(path)
    check(import_file(path, act=act, heads=2).model, case)        # the heads too: width 16 / 64 would say 1
    assert main(["import", str(path), "--out", str(tmp_path / "no.safetensors")]) == 2
    out = tmp_path / "act.safetensors"
    assert main(["import", str(path), "--out", str(out), "--act", act, "--heads", "2"]) == 0
    check(load_checkpoint(out).model, case)


def test_an_unknown_architecture_asks_for_the_activation_and_model_args_give_it(tmp_path):
    config = dict(META["clip_quickgelu"]["config"], architecture="my_clip_variant")
    with pytest.raises(CheckpointError, match="my_clip_variant.*--act"):
        import_file(_folder("clip_quickgelu", tmp_path, config=config))
    config["model_args"] = dict(config["model_args"], act_layer="quick_gelu")
    check(import_file(_folder("clip_quickgelu", tmp_path, config=config)).model, "clip_quickgelu")


def test_a_wrong_activation_changes_the_outputs_and_an_explicit_one_is_noted(tmp_path):
    imp = import_file(_folder("clip_quickgelu", tmp_path), act="gelu")
    assert imp.model.cfg.act == "gelu" and any("quick_gelu" in n for n in imp.notes)
    with torch.no_grad():
        assert (imp.model(CASES["clip_quickgelu"]["x"]) - CASES["clip_quickgelu"]["logits"]).abs().max() > 1e-3


def test_a_swinv2_without_config_asks_for_its_window(tmp_path):
    case = "swinv2_shift_clamped"
    path = _folder(case, tmp_path, config={})
    with pytest.raises(CheckpointError, match="--window"):
        import_file(path, img_size="32")
    check(import_file(path, img_size="32", window=4).model, case)
    out = tmp_path / "w.safetensors"
    assert main(["import", str(path), "--out", str(out), "--img-size", "32", "--window", "4"]) == 0
    check(load_checkpoint(out).model, case)


def test_bare_beit_and_swin_files_import_from_their_keys(tmp_path):
    """BEiT's grid and heads are in its tables; Swin's windows and heads too (the image size is
    given: the keys do not say it)."""
    for case in ("beit_layer_bias_mean", "beit_shared_bias_ape_token"):
        check(import_file(_folder(case, tmp_path, config={})).model, case)
    imp = import_file(_folder("swin_shift_clamped", tmp_path, config={}), img_size="32")
    assert imp.family == "timm-swin"
    check(imp.model, "swin_shift_clamped")


def test_microsofts_original_swin_layout_imports_too():
    """Microsoft's files merge patches at the end of a stage (`layers.0.downsample`) and name the
    head `head`; timm's loader renames them, so does the importer."""
    sd = {}
    for k, v in _sd("swin_shift_clamped").items():
        if k.startswith("layers.") and ".downsample." in k:
            s = int(k.split(".")[1])
            k = k.replace(f"layers.{s}.", f"layers.{s - 1}.", 1)
        sd[k.replace("head.fc.", "head.")] = v
    check(import_state_dict(sd, img_size=(32, 32)).model, "swin_shift_clamped")


# ----------------------------------------------------------------------------- refused
def test_a_swin_size_timm_computes_otherwise_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="stage 0 .6x6 tokens. is shifted and padded.*rolls before padding"):
        import_file(_folder("swinv2_shift_clamped", tmp_path), img_size="24")   # 6x6 tokens, shifted 4x4 windows
    with pytest.raises(CheckpointError, match="stage 1's relative_position_bias_table covers 4x4 windows.*one window"):
        import_file(_folder("swin_shift_clamped", tmp_path), img_size="16")     # 2x2 tokens, a table of 4x4 windows
    sd = {k: v for k, v in _sd("swin_shift_clamped").items()}                     # Swin-S3: a window per stage
    sd["layers.2.blocks.0.attn.relative_position_bias_table"] = torch.zeros(49, 2)
    with pytest.raises(CheckpointError, match="stage 2's relative_position_bias_table covers 4x4 windows"):
        import_state_dict(sd, img_size=(32, 32))


def test_eva02_needs_its_config_and_its_mlp_norm_is_refused_by_name(tmp_path):
    case = "eva02_tiny_336_style"
    with pytest.raises(CheckpointError, match="blocks.0.mlp.fc1.weight.*Eva.*config.json"):
        import_file(_folder(case, tmp_path, config={}))
    sd = {**_sd(case), "blocks.0.mlp.norm.weight": torch.ones(42), "blocks.0.mlp.norm.bias": torch.zeros(42)}
    with pytest.raises(CheckpointError, match=r"blocks.0.mlp.norm.bias is a norm inside the MLP \(scale_mlp: EVA-02"):
        import_state_dict(sd, hf_config=META[case]["config"])
    sd = {**_sd(case), "blocks.1.attn.norm.weight": torch.ones(16)}
    with pytest.raises(CheckpointError, match="blocks.1.attn.norm.weight is a norm inside attention"):
        import_state_dict(sd, hf_config=META[case]["config"])


def test_files_of_timms_eva_class_that_look_like_beit_or_vit_are_refused(tmp_path):
    """timm's Eva class (EVA, EVA-02 CLIP, the RoPE ViTs, PE, timm's DINOv3) shares BEiT's and
    timm ViT's key names, its rotary embedding or post-norm not in the keys."""
    sd = {k: v for k, v in _sd("beit_layer_bias_mean").items() if "relative_position" not in k}
    with pytest.raises(CheckpointError, match="no relative position bias table: not a timm BEiT but timm's Eva"):
        import_state_dict(sd)
    config = dict(META["clip_quickgelu"]["config"], architecture="vit_base_patch16_rope_reg1_gap_256")
    with pytest.raises(CheckpointError, match="vit_base_patch16_rope_reg1_gap_256.*Eva class"):
        import_file(_folder("clip_quickgelu", tmp_path, config=config))


def test_unplaced_timm_keys_are_named():
    with pytest.raises(CheckpointError, match=r"timm-beit keys vitpe cannot place.*blocks.0.attn.extra"):
        import_state_dict({**_sd("beit_layer_bias_mean"), "blocks.0.attn.extra": torch.zeros(2)})
    with pytest.raises(CheckpointError, match=r"does not compute.*layers.0.blocks.0.attn.extra"):
        import_state_dict({**_sd("swin_shift_clamped"), "layers.0.blocks.0.attn.extra": torch.zeros(2)},
                          img_size=(32, 32))
    with pytest.raises(CheckpointError, match="--act is for timm-layout ViTs"):
        import_state_dict(_sd("beit_layer_bias_mean"), act="gelu")


def test_timms_dinov3_needs_its_config_and_other_rotary_options_are_refused(tmp_path):
    """A bare DINOv3 file looks like other Eva models with registers (`vit_*_rope_reg*`, another
    rotary embedding): refused naming the config.json; what vitpe does not compute is refused by name."""
    case = "dinov3_small_reg4_nonsquare"
    path = _folder(case, tmp_path, config={})
    with pytest.raises(CheckpointError, match=r"reg_token.*config.json \(architecture vit_\*_dinov3\*\)"):
        import_file(path)
    assert main(["import", str(path), "--out", str(tmp_path / "no.safetensors")]) == 2
    config = dict(META[case]["config"], architecture="vit_base_patch16_rope_reg1_gap_256")
    with pytest.raises(CheckpointError, match="vit_base_patch16_rope_reg1_gap_256"):
        import_file(_folder(case, tmp_path, config=config))
    for arg, value in (("rope_grid_indexing", "xy"), ("rope_rotate_half", False), ("rope_type", "cat")):
        config = dict(META[case]["config"])
        config["model_args"] = {**config["model_args"], arg: value}
        with pytest.raises(CheckpointError, match=f"{arg}="):
            import_file(_folder(case, tmp_path, config=config))
    sd = {**_sd(case), "blocks.0.attn.q_norm.weight": torch.ones(16)}
    with pytest.raises(CheckpointError, match="blocks.0.attn.q_norm.weight is a norm inside attention"):
        import_state_dict(sd, hf_config=META[case]["config"])
    sd = {**_sd(case), "pos_embed": torch.zeros(1, 29, 32)}
    with pytest.raises(CheckpointError, match="pos_embed beside DINOv3's rotary embedding"):
        import_state_dict(sd, hf_config=META[case]["config"])


def test_timms_dinov3_runs_at_another_size_and_reads_out_as_asked(tmp_path):
    """No table: the rotary embedding is computed on any grid (timm's `dynamic_img_size`); `--pool`
    overrides the config's `global_pool`."""
    case = "dinov3_small_reg4_nonsquare"
    imp = import_file(_folder(case, tmp_path), img_size="48x32")
    assert imp.model.cfg.grid == (6, 4)
    with torch.no_grad():
        assert imp.model(torch.zeros(1, 3, 48, 32)).shape == (1, 7)
    assert import_file(_folder(case, tmp_path), pool="token").model.cfg.pool == "token"
