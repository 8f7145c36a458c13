"""BEiT, data2vec-vision, DINOv2 (with and without registers), DINOv3, CLIP and SigLIP import
exactly: tiny random models built by `transformers` itself, written with `save_pretrained`
(`model.safetensors` + `config.json`), imported by the library and by the CLI, give the same
logits (or the headless model's output) and the same attention weights in every layer, within
1e-5 relative in float32; the checkpoint stays float32."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vitpe_core.checkpoint import CheckpointError, load_checkpoint
from vitpe_core.importers import detect_family, import_file

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (requirements-dev.txt)")

SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
             patch_size=8)
DINO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, image_size=32, patch_size=8)
TEXT = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vocab_size=64)
BEIT = dict(**SMALL, layer_scale_init_value=0.1)

# name: (model class, config class, config options, family, what the output is)
CASES = {
    "beit_layer_bias_mean": ("BeitForImageClassification", "BeitConfig",
                             dict(BEIT, num_labels=5, use_relative_position_bias=True, use_mean_pooling=True), "beit"),
    "beit_shared_bias_ape_cls": ("BeitForImageClassification", "BeitConfig",
                                 dict(BEIT, num_labels=5, use_shared_relative_position_bias=True,
                                      use_absolute_position_embeddings=True, use_mean_pooling=False), "beit"),
    "beit_backbone": ("BeitModel", "BeitConfig", dict(BEIT, use_relative_position_bias=True), "beit"),
    "data2vec_vision": ("Data2VecVisionForImageClassification", "Data2VecVisionConfig",
                        dict(BEIT, num_labels=5, use_relative_position_bias=True), "data2vec-vision"),
    "data2vec_vision_shared": ("Data2VecVisionForImageClassification", "Data2VecVisionConfig",
                               dict(BEIT, num_labels=5, use_shared_relative_position_bias=True,
                                    use_mean_pooling=False), "data2vec-vision"),
    "dinov2_classifier": ("Dinov2ForImageClassification", "Dinov2Config", dict(DINO, num_labels=5), "dinov2"),
    "dinov2_backbone_swiglu": ("Dinov2Model", "Dinov2Config", dict(DINO, use_swiglu_ffn=True), "dinov2"),
    "dinov2_registers_classifier": ("Dinov2WithRegistersForImageClassification", "Dinov2WithRegistersConfig",
                                    dict(DINO, num_labels=5, num_register_tokens=3), "dinov2"),
    "dinov2_registers_backbone": ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig",
                                  dict(DINO, num_register_tokens=2), "dinov2"),
    "dinov3": ("DINOv3ViTModel", "DINOv3ViTConfig", dict(SMALL, image_size=[24, 40], num_register_tokens=2), "dinov3"),
    "dinov3_gated_nobias": ("DINOv3ViTModel", "DINOv3ViTConfig",
                            dict(SMALL, use_gated_mlp=True, hidden_act="silu", proj_bias=False, mlp_bias=False,
                                 rope_theta=50.0), "dinov3"),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", dict(SMALL), "clip"),
    "clip_classifier": ("CLIPForImageClassification", "CLIPConfig",
                        dict(vision_config=SMALL, text_config=TEXT, num_labels=5), "clip"),
    "clip_whole": ("CLIPModel", "CLIPConfig", dict(vision_config=SMALL, text_config=TEXT), "clip"),
    "siglip_vision_map": ("SiglipVisionModel", "SiglipVisionConfig", dict(SMALL), "siglip"),
    "siglip_classifier": ("SiglipForImageClassification", "SiglipConfig",
                          dict(vision_config=SMALL, text_config=TEXT, num_labels=5), "siglip"),
}


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    scale = b.abs().max().clamp_min(1e-6)
    assert a.shape == b.shape, (a.shape, b.shape)
    assert (a - b).abs().max() <= rel * scale, f"max abs diff {(a - b).abs().max():.3g} vs scale {scale:.3g}"


def build(case: str, **overrides):
    """The case's transformers model with random weights (every parameter moved off its init, so
    zero tables, unit LayerScales and zero biases do not hide a mapping error), eval mode;
    `overrides` change the case's config options."""
    cls_name, cfg_name, options, _ = CASES[case]
    config = getattr(transformers, cfg_name)(**{**options, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def image_size(model) -> tuple[int, int]:
    cfg = getattr(model.config, "vision_config", model.config)
    size = cfg.image_size
    return tuple(size) if isinstance(size, (list, tuple)) else (size, size)


def reference(model, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """What the transformers model puts out for `x` (logits, or the vision model's pooled
    output), and every layer's attention weights."""
    with torch.no_grad():
        if isinstance(model, (transformers.CLIPModel, transformers.SiglipModel)):
            out = model.vision_model(pixel_values=x, output_attentions=True)
        else:
            out = model(pixel_values=x, output_attentions=True)
    main = out.logits if hasattr(out, "logits") else out.pooler_output
    return main, list(out.attentions)


def save(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder / "model.safetensors"


def check(imported, model, x) -> None:
    ref, attentions = reference(model, x)
    rec: list[dict] = []
    with torch.no_grad():
        out = imported(x, trace=rec)
        fast = imported(x)                     # the SDPA path agrees with the trace path
    _close(out, ref)
    _close(fast, ref)
    assert len(rec) == len(attentions) == 2
    for mine, theirs in zip(rec, attentions):
        _close(mine["attn"], theirs)


@pytest.mark.parametrize("case", list(CASES))
def test_a_save_pretrained_folder_imports_exactly(case, tmp_path):
    model = build(case)
    path = save(model, tmp_path / case)
    imp = import_file(path)
    assert imp.family == CASES[case][3]
    assert imp.model.cfg.img_size == image_size(model)
    x = torch.randn(2, 3, *image_size(model))
    check(imp.model, model, x)
    labels = getattr(model.config, "id2label", {})
    if imp.model.cfg.num_classes:
        assert imp.class_names == [labels[i] for i in range(imp.model.cfg.num_classes)]


@pytest.mark.parametrize("case", ["beit_layer_bias_mean", "beit_shared_bias_ape_cls", "dinov2_registers_classifier",
                                  "dinov3", "clip_vision", "siglip_vision_map"])
def test_what_each_family_becomes(case, tmp_path):
    """The import is the family's structure, not just equal numbers: bias tables per layer or
    shared (the bias explorer's learned rows), registers, rotation, pre-norm, read-out."""
    model = build(case)
    cfg = import_file(save(model, tmp_path / case)).model.cfg
    expect = {
        "beit_layer_bias_mean": dict(encoding="rpb_cls", pool="avg", fc_norm=True, layer_scale=True),
        "beit_shared_bias_ape_cls": dict(encoding="rpb_cls+ape", pool="token", encoding_options={
            "shared": True, "ape_interpolation": "bicubic", "ape_antialias": False}),   # transformers' resampling
        "dinov2_registers_classifier": dict(encoding="ape", reg_tokens=3, no_embed_class=True, pool="token+avg"),
        "dinov3": dict(encoding="rope_dinov3", reg_tokens=2, grid=(3, 5), pool="token"),
        "clip_vision": dict(pre_norm=True, act="quick_gelu", pool="token", class_token=True),
        "siglip_vision_map": dict(class_token=False, pool="map", act="gelu_tanh"),
    }[case]
    for field, value in expect.items():
        assert getattr(cfg, field) == value, (field, getattr(cfg, field))


def test_the_beit_bias_explorer_shows_each_layers_learned_table(tmp_path):
    """The bias the trace records is BEiT's table entry for each offset, per layer and head,
    with the three CLS entries in the CLS row and column (what the bias page draws)."""
    model = build("beit_layer_bias_mean")
    imp = import_file(save(model, tmp_path / "b"))
    rec: list[dict] = []
    with torch.no_grad():
        imp.model(torch.randn(1, 3, 32, 32), trace=rec)
    for i, layer in enumerate(model.beit.layers):
        table = layer.relative_position_bias.relative_position_bias_table.detach()   # (7*7 + 3, h)
        index = layer.relative_position_bias.generate_relative_position_index((4, 4))
        expected = table[index.reshape(-1)].reshape(17, 17, -1).permute(2, 0, 1)     # (h, T, T)
        torch.testing.assert_close(rec[i]["bias"][0], expected)
    assert not torch.equal(rec[0]["bias"], rec[1]["bias"])                          # per layer


def test_dinov2_runs_at_the_processors_crop_with_the_table_resampled_as_transformers_does(tmp_path):
    """The released DINOv2 tables are trained at 518 px and run at the processor's 224-px crop,
    transformers resampling the table at every forward: the import does it once, the same way
    (without antialiasing for DINOv2, with it for DINOv2 with registers)."""
    for case in ("dinov2_classifier", "dinov2_registers_classifier"):
        model = build(case, image_size=64)                                          # an 8x8 table
        folder = tmp_path / case
        path = save(model, folder)
        (folder / "preprocessor_config.json").write_text(json.dumps({
            "crop_size": {"height": 40, "width": 40}, "do_center_crop": True, "size": {"shortest_edge": 48},
            "image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225]}))
        imp = import_file(path)
        assert imp.model.cfg.img_size == (40, 40) and any("crop size" in n for n in imp.notes)
        assert imp.preprocess["mean"] == [0.485, 0.456, 0.406] and imp.preprocess["crop_pct"] == round(40 / 48, 4)
        check(imp.model, model, torch.randn(2, 3, 40, 40))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["beit_shared_bias_ape_cls", "dinov2_registers_backbone", "dinov3_gated_nobias",
                                  "siglip_classifier"])
def test_the_cli_imports_a_folder_and_stores_float32_as_float32(case, tmp_path, capsys):
    from vitpe_core.__main__ import main
    model = build(case)
    path = save(model, tmp_path / case)
    out = tmp_path / f"{case}.safetensors"
    assert main(["import", str(path), "--out", str(out)]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["family"] == CASES[case][3] and line["stored_dtype"] == "float32"
    ckpt = load_checkpoint(out)
    assert ckpt.metrics["stored_dtype"] == ckpt.metrics["source_dtype"] == "float32"
    check(ckpt.model, model, torch.randn(2, 3, *image_size(model)))
    half = tmp_path / "half.safetensors"
    assert main(["import", str(path), "--out", str(half), "--half"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["stored_dtype"] == "float16" and any("Stored as float16" in n for n in line["notes"])
    assert load_checkpoint(half).metrics["stored_dtype"] == "float16"


def test_hub_layout_names_import_too(tmp_path):
    """Files on the hub carry transformers 4's names (BEiT `encoder.layer.N.attention.attention.query`,
    `encoder.relative_position_bias`; DINOv2 `attention.attention.query`, packed SwiGLU
    `weights_in`; DINOv3 `layer.N`; CLIP's `position_ids` buffers): the same numbers."""
    renames = {
        "beit_shared_bias_ape_cls": [("beit.layers.", "beit.encoder.layer."),
                                     (".attention.q_proj.", ".attention.attention.query."),
                                     (".attention.k_proj.", ".attention.attention.key."),
                                     (".attention.v_proj.", ".attention.attention.value."),
                                     (".attention.o_proj.", ".attention.output.dense."),
                                     (".mlp.fc1.", ".intermediate.dense."), (".mlp.fc2.", ".output.dense."),
                                     ("beit.shared_position_bias.", "beit.encoder.relative_position_bias.")],
        "dinov2_backbone_swiglu": [(".attention.q_proj.", ".attention.attention.query."),
                                   (".attention.k_proj.", ".attention.attention.key."),
                                   (".attention.v_proj.", ".attention.attention.value."),
                                   (".attention.o_proj.", ".attention.output.dense."),
                                   (".mlp.down_proj.", ".mlp.weights_out.")],
        "dinov3": [("model.layer.", "layer.")],
        "clip_whole": [],        # transformers 4 kept `position_ids` buffers in the file (below)
    }
    for case, pairs in renames.items():
        model = build(case)
        sd = {}
        for k, v in model.state_dict().items():
            for a, b in pairs:
                k = k.replace(a, b)
            sd[k] = v
        for p in ("weight", "bias"):       # the hub's DINOv2 SwiGLU keeps gate and up in one tensor
            for i in range(2):
                g, u = f"encoder.layer.{i}.mlp.gate_proj.{p}", f"encoder.layer.{i}.mlp.up_proj.{p}"
                if g in sd:
                    sd[f"encoder.layer.{i}.mlp.weights_in.{p}"] = torch.cat((sd.pop(g), sd.pop(u)))
        if case == "clip_whole":
            for tower in ("vision_model", "text_model"):
                sd[f"{tower}.embeddings.position_ids"] = torch.arange(17)[None]
        from vitpe_core.importers import import_state_dict
        imp = import_state_dict(sd, hf_config=model.config.to_dict())
        check(imp.model, model, torch.randn(1, 3, *image_size(model)))


def test_keys_no_rule_places_and_a_wrong_model_type_are_refused(tmp_path):
    model = build("beit_layer_bias_mean")
    sd = dict(model.state_dict())
    from vitpe_core.importers import import_state_dict
    with pytest.raises(CheckpointError, match=r"beit keys vitpe cannot place.*'beit.layers.0.attention.q_norm.weight'"):
        import_state_dict({**sd, "beit.layers.0.attention.q_norm.weight": torch.ones(8)},
                          hf_config=model.config.to_dict())
    with pytest.raises(CheckpointError, match="model_type 'dinov2'.*beit"):
        detect_family(sd, {"model_type": "dinov2"})
    with pytest.raises(CheckpointError, match="--pool is for bare timm-layout files"):
        import_state_dict(sd, hf_config=model.config.to_dict(), pool="avg")


# ----------------------------------------------------------------------------- hub ids
def _hub_cache(root: Path, repo: str, folder: Path) -> None:
    """Lay out `huggingface_hub`'s cache for `repo` with `folder`'s files, as a download leaves it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = root / f"models--{repo.replace('/', '--')}"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    snap = base / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())


def _cli(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent / "hf")}
    return subprocess.run([sys.executable, "-m", "vitpe_core", "import", *args], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parents[1], timeout=300)


@pytest.mark.slow
def test_a_hub_id_downloads_the_weights_and_the_config_through_huggingface_hub(tmp_path):
    """`python -m vitpe_core import microsoft/beit-base-patch16-224` runs the same code with a
    network as here, offline, against a cache laid out as a download leaves it."""
    model = build("beit_layer_bias_mean")
    save(model, tmp_path / "src")
    (tmp_path / "src" / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.4, 0.5, 0.6],
                                                                            "image_std": [0.2, 0.3, 0.4]}))
    _hub_cache(tmp_path / "cache", "microsoft/beit-base-patch16-224", tmp_path / "src")
    out = tmp_path / "beit.safetensors"
    res = _cli(["microsoft/beit-base-patch16-224", "--out", str(out)], tmp_path / "cache")
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["family"] == "beit"
    ckpt = load_checkpoint(out)
    assert ckpt.metrics["source"] == "microsoft/beit-base-patch16-224"
    assert ckpt.metrics["preprocess"]["mean"] == [0.4, 0.5, 0.6]            # preprocessor_config.json, fetched too
    assert ckpt.metrics["class_names"] == [model.config.id2label[i] for i in range(5)]
    check(ckpt.model, model, torch.randn(1, 3, 32, 32))
    res = _cli(["facebook/not-in-the-cache", "--out", str(tmp_path / "x.safetensors")], tmp_path / "cache")
    assert res.returncode == 2 and "model.safetensors" in res.stderr and "config.json" in res.stderr, res.stderr
    assert "huggingface.co/facebook/not-in-the-cache" in res.stderr and not (tmp_path / "x.safetensors").exists()


def test_a_bare_beit_file_without_its_config_reads_grid_heads_and_read_out_from_the_keys():
    """An upload is a bare file (no config.json beside it): the table gives the grid and the
    heads, the pooler layernorm the mean read-out."""
    from vitpe_core.importers import import_state_dict
    model = build("beit_layer_bias_mean")
    imp = import_state_dict(model.state_dict())
    assert (imp.model.cfg.grid, imp.model.cfg.heads, imp.model.cfg.pool) == ((4, 4), 4, "avg")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():   # BEiT's LayerNorm eps is 1e-12 in its config, and the default when it is missing
        _close(imp.model(x), model(pixel_values=x).logits)


def test_dinov3_at_another_input_size_equals_transformers_there(tmp_path):
    """DINOv3's RoPE is defined on normalised patch centres, so the model runs at any size; at
    an input size other than the config's it still equals transformers' (which accepts any)."""
    model = build("dinov3")                                             # config: 24x40
    imp = import_file(save(model, tmp_path / "d3"))
    check(imp.model, model, torch.randn(1, 3, 48, 32))                  # a 6x4 grid
