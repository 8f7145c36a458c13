"""Bring your own ViT: imported models compute what the real implementations compute.

timm / RoPE-ViT: against vectors written by scripts/make_import_references.py in a side
environment with timm 1.0.31 (timm cannot be installed beside the project's torch);
Hugging Face: against `transformers` itself, built here with random weights."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vitpe_core import analysis
from vitpe_core.checkpoint import CheckpointError, load_checkpoint
from vitpe_core.encodings.absolute import resample_abs_pos_embed
from vitpe_core.importers import GridUnknownError, detect_family, import_checkpoint, import_file, import_state_dict

REFS = Path(__file__).parent / "data" / "import_references.safetensors"


def case_state_dict(cases: dict[str, dict[str, torch.Tensor]], case: str) -> dict[str, torch.Tensor]:
    """A reference case's state dict in its own key names (a copy: an import may spend it)."""
    return {k[3:]: v.clone() for k, v in cases[case].items() if k.startswith("sd.")}


def case_folder(meta: dict, cases: dict[str, dict[str, torch.Tensor]], case: str, tmp_path: Path,
                config: dict | None = None, sd: dict | None = None) -> Path:
    """`model.safetensors` (the case's state dict, or `sd`) and timm's `config.json` (the case's,
    `config`, or none where `config={}`) of a reference case, in a folder of its own; the weights' path."""
    folder = tmp_path / case
    folder.mkdir(parents=True, exist_ok=True)
    save_file(case_state_dict(cases, case) if sd is None else sd, str(folder / "model.safetensors"))
    config = meta[case]["config"] if config is None else config
    (folder / "config.json").unlink(missing_ok=True)
    if config:
        (folder / "config.json").write_text(json.dumps(config))
    return folder / "model.safetensors"


def _refs(path: Path = REFS) -> tuple[dict, dict[str, dict[str, torch.Tensor]]]:
    """A reference file of scripts/make_import_references.py: (its cases' metadata, case -> tensors)."""
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["cases"])
        cases: dict[str, dict[str, torch.Tensor]] = {}
        for key in f.keys():
            case, rest = key.split(".", 1)
            cases.setdefault(case, {})[rest] = f.get_tensor(key)
    return meta, cases


META, CASES = _refs()
MODEL_CASES = [c for c in META if not c.startswith("resample")]
HEADS = 2   # every reference model; a state dict does not record it (real ViTs: width / 64, the default)


AMBIGUOUS = {"ropevit_axial_ape": "rope-vit"}   # DeiT-III names + table, no freqs: the user says which (tested below)


def _import(case: str, **kw):
    sd = {k[3:]: v for k, v in CASES[case].items() if k.startswith("sd.")}
    kw = {"img_size": tuple(META[case]["input"]), "family": AMBIGUOUS.get(case, "auto"), **kw}
    return import_state_dict(sd, heads=HEADS, **kw)


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-4) -> None:
    scale = b.abs().max().clamp_min(1e-6)
    assert (a - b).abs().max() <= rel * scale, f"max abs diff {(a - b).abs().max():.3g} vs scale {scale:.3g}"


@pytest.mark.parametrize("case", MODEL_CASES)
def test_imported_model_matches_reference_logits_and_every_attention(case):
    ref = CASES[case]
    imp = _import(case)
    assert imp.family == META[case]["family"]
    rec: list[dict] = []
    with torch.no_grad():
        logits = imp.model(ref["x"], trace=rec)
        fast = imp.model(ref["x"])                       # the SDPA path agrees with the trace path
    _close(logits, ref["logits"])
    _close(fast, ref["logits"])
    n_layers = sum(1 for k in ref if k.startswith("attn."))
    assert len(rec) == n_layers
    for i, layer in enumerate(rec):
        _close(layer["attn"], ref[f"attn.{i}"])


def test_detected_layouts_match_the_reference_models():
    cfg = lambda case: _import(case).model.cfg
    c = cfg("timm_gap_fcnorm_noqkvbias")
    assert (c.class_token, c.pool, c.fc_norm, c.qkv_bias) == (False, "avg", True, False)
    c = cfg("timm_reg4_noembed_ls_nonsquare")
    assert (c.reg_tokens, c.no_embed_class, c.layer_scale, c.grid, c.num_prefix) == (4, True, True, (3, 5), 5)
    c = cfg("timm_deit_distilled")
    assert (c.dist_token, c.num_prefix) == (True, 2)
    assert cfg("timm_deit3_ls_noembed").no_embed_class
    assert cfg("ropevit_mixed_ape").encoding == "rope_mixed+ape"
    assert cfg("ropevit_axial").encoding == "rope_axial"


@pytest.mark.parametrize("case", [c for c in META if c.startswith("resample")])
def test_table_resampling_matches_timm(case):
    m = META[case]
    out = resample_abs_pos_embed(CASES[case]["in"], tuple(m["new"]), tuple(m["old"]), m["prefix"])
    _close(out, CASES[case]["out"], rel=1e-5)


# ----------------------------------------------------------------------------- Hugging Face
transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (requirements-dev.txt)")


def _hf(cls_name: str, **kw):
    config = transformers.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                                    image_size=(24, 32), patch_size=8, num_labels=5, attn_implementation="eager", **kw)
    torch.manual_seed(0)
    model = getattr(transformers, cls_name)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model, config


def hub_layout(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers 5's names -> the names files on the hub carry (transformers 4's ViT)."""
    names = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
             "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense",
             "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    out = {}
    for k, v in sd.items():
        k = k.replace("layers.", "encoder.layer.")
        for new, old in names.items():
            k = k.replace(f".{new}.", f".{old}.")
        out[k] = v
    return out


@pytest.mark.parametrize("qkv_bias, layout", [(True, "transformers"), (False, "transformers"), (True, "hub")])
def test_hf_image_classification_matches_transformers(qkv_bias, layout):
    model, config = _hf("ViTForImageClassification", qkv_bias=qkv_bias)
    x = torch.randn(2, 3, 24, 32)
    with torch.no_grad():
        out = model(pixel_values=x, output_attentions=True)
    sd = model.state_dict() if layout == "transformers" else hub_layout(model.state_dict())
    assert layout == "transformers" or "vit.encoder.layer.1.attention.attention.query.weight" in sd
    imp = import_state_dict(sd, hf_config=config.to_dict())
    assert imp.family == "hf" and imp.model.cfg.grid == (3, 4) and imp.model.cfg.heads == 4
    assert imp.class_names == [config.id2label[i] for i in range(5)]
    rec: list[dict] = []
    with torch.no_grad():
        logits = imp.model(x, trace=rec)
    _close(logits, out.logits)
    for i, layer in enumerate(rec):
        _close(layer["attn"], out.attentions[i])


def test_hf_backbone_matches_transformers_cls_features():
    model, config = _hf("ViTModel")
    x = torch.randn(1, 3, 24, 32)
    with torch.no_grad():
        ref = model(pixel_values=x).last_hidden_state[:, 0]
    imp = import_state_dict(model.state_dict(), hf_config=config.to_dict())
    assert imp.model.cfg.num_classes == 0 and any("pooler" in n for n in imp.notes)
    with torch.no_grad():
        _close(imp.model(x), ref)


# ----------------------------------------------------------------------------- files and checkpoints
def test_import_writes_a_checkpoint_that_loads_and_runs_at_its_own_size(tmp_path):
    sd = {k[3:]: v for k, v in CASES["timm_reg4_noembed_ls_nonsquare"].items() if k.startswith("sd.")}
    save_file(sd, str(tmp_path / "w.safetensors"))
    imp = import_checkpoint(tmp_path / "w.safetensors", tmp_path / "mine.safetensors", licence="Apache-2.0",
                            heads=HEADS, img_size="24x40")   # a non-square table needs its size
    ckpt = load_checkpoint(tmp_path / "mine.safetensors")
    assert ckpt.metrics["family"] == "timm" and ckpt.metrics["licence"] == "Apache-2.0"
    assert ckpt.metrics["source"] == "w.safetensors" and len(ckpt.metrics["class_names"]) == 7
    assert ckpt.config.reg_tokens == 4 and ckpt.config.grid == (3, 5)
    x = CASES["timm_reg4_noembed_ls_nonsquare"]["x"]
    with torch.no_grad():   # the checkpoint keeps the file's float32 weights: the same model, the same logits
        assert torch.equal(ckpt.model(x), imp.model(x))
    assert ckpt.metrics["stored_dtype"] == "float32"
    tr = analysis.trace_image(ckpt.model, x[0])
    assert tr.prefix == ("CLS", "reg 0", "reg 1", "reg 2", "reg 3")
    assert analysis.patch_maps(tr, (2, 4))["attn"].shape == (2, 2, 3, 5)


@pytest.mark.parametrize("source, asked, stored", [(torch.float32, "source", torch.float32),
                                                   (torch.float16, "source", torch.float16),
                                                   (torch.bfloat16, "source", torch.bfloat16),
                                                   (torch.float32, "float16", torch.float16)])
def test_an_import_keeps_the_files_precision_unless_asked(tmp_path, capsys, source, asked, stored):
    """A float32 file was stored as float16, silently (2.4e-4 relative off the source's logits):
    the stored weights are now the file's, bit for bit, unless `--dtype` asks otherwise (said)."""
    from safetensors import safe_open

    from vitpe_core.__main__ import main
    sd = {k: v.to(source) if v.is_floating_point() else v for k, v in _timm_sd().items()}
    save_file(sd, str(tmp_path / "w.safetensors"))
    out = tmp_path / "mine.safetensors"
    assert main(["import", str(tmp_path / "w.safetensors"), "--out", str(out), "--heads", str(HEADS),
                 "--dtype", asked]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["stored_dtype"] == str(stored).removeprefix("torch.")
    with safe_open(str(out), "pt") as f:
        kept = {k: f.get_tensor(k) for k in f.keys()}
    assert kept["blocks.0.attn.qkv.weight"].dtype == stored
    if stored == source:       # bit for bit: the checkpoint is the file's model
        assert torch.equal(kept["blocks.0.attn.qkv.weight"], sd["blocks.0.attn.qkv.weight"])
        assert torch.equal(kept["pos_enc.pos_embed"], sd["pos_embed"])
    else:
        assert any("Stored as float16 on request" in n for n in line["notes"])
    ckpt = load_checkpoint(out)
    assert ckpt.metrics["stored_dtype"] == str(stored).removeprefix("torch.")
    assert ckpt.metrics["source_dtype"] == str(source).removeprefix("torch.")


def test_the_table_is_resampled_at_import_for_another_size():
    case = "timm_cls"
    sd = {k[3:]: v for k, v in CASES[case].items() if k.startswith("sd.")}
    imp = import_state_dict(sd, img_size=(48, 40), heads=HEADS)
    assert imp.model.cfg.grid == (6, 5) and any("resampled" in n for n in imp.notes)
    expected = resample_abs_pos_embed(sd["pos_embed"], (6, 5), (4, 4), 1)
    torch.testing.assert_close(imp.model.pos_enc.pos_embed.detach(), expected)


# ----------------------------------------------------------------------------- refusals
def _timm_sd() -> dict[str, torch.Tensor]:
    return {k[3:]: v.clone() for k, v in CASES["timm_cls"].items() if k.startswith("sd.")}


def test_default_heads_is_width_over_64_and_a_wrong_guess_changes_the_outputs():
    ref = CASES["timm_cls"]
    sd = {k[3:]: v for k, v in ref.items() if k.startswith("sd.")}
    one_head = import_state_dict(sd)                 # width 32 -> 1 head: not the reference's 2
    assert one_head.model.cfg.heads == 1
    with torch.no_grad():
        assert (one_head.model(ref["x"]) - ref["logits"]).abs().max() > 0.1


def test_unknown_and_ambiguous_layouts_are_refused_with_the_deciding_keys():
    with pytest.raises(CheckpointError, match="unknown layout.*first keys"):
        detect_family({"conv1.weight": torch.zeros(1), "fc.weight": torch.zeros(1)})
    mixed = {**_timm_sd(), "vit.embeddings.cls_token": torch.zeros(1, 1, 32)}
    with pytest.raises(CheckpointError, match="ambiguous layout.*hf.*timm"):
        detect_family(mixed)
    deit3_or_rope = {k.replace("ls1.gamma", "gamma_1"): v for k, v in _timm_sd().items()}
    deit3_or_rope["blocks.0.gamma_1"] = torch.ones(32)
    with pytest.raises(CheckpointError, match="--family rope-vit"):
        detect_family(deit3_or_rope)


@pytest.mark.parametrize("extra, what", [("blocks.0.attn.q_norm.weight", "qk_norm"),
                                         ("norm_pre.weight", "pre-norm"),
                                         ("blocks.1.mlp.fc1_g.weight", "SwiGLU")])
def test_layers_vitpe_does_not_compute_are_refused(extra, what):
    with pytest.raises(CheckpointError, match=what):
        import_state_dict({**_timm_sd(), extra: torch.ones(32)})


def test_missing_and_extra_model_keys_are_named():
    sd = _timm_sd()
    del sd["blocks.1.mlp.fc2.weight"]
    with pytest.raises(CheckpointError, match=r"missing keys \['blocks.1.mlp.fc2.weight'\]"):
        import_state_dict(sd)
    with pytest.raises(CheckpointError, match="unexpected keys.*blocks.0.attn.extra"):
        import_state_dict({**_timm_sd(), "blocks.0.attn.extra": torch.zeros(3)})
    notes = import_state_dict({**_timm_sd(), "teacher.fc.weight": torch.zeros(3)}).notes   # outside the model
    assert any("teacher.*" in n for n in notes)


def test_non_square_table_asks_for_the_image_size():
    sd = _timm_sd()
    sd["pos_embed"] = torch.randn(1, 1 + 4 * 6, 32)
    with pytest.raises(GridUnknownError, match="--img-size") as err:
        import_state_dict(sd)
    assert err.value.table == "pos_embed has 25 rows with 1 prefix token(s): not a square grid of patches"
    assert import_state_dict(sd, img_size=(32, 48)).model.cfg.grid == (4, 6)
    assert import_state_dict(sd, grid=(4, 6)).model.cfg.grid == (4, 6)
    with pytest.raises(CheckpointError, match="too large"):   # a typed size must not allocate gigabytes
        import_state_dict(_timm_sd(), img_size=(16_000, 16_000))


def test_bad_files_get_clear_messages_without_allocating(tmp_path):
    good = tmp_path / "good.safetensors"
    save_file(_timm_sd(), str(good))
    data = good.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="trunc.safetensors is not a readable safetensors file"):
        import_file(tmp_path / "trunc.safetensors")
    header = json.dumps({"w": {"dtype": "F32", "shape": [2 ** 40, 2 ** 20], "data_offsets": [0, 2 ** 62]}}).encode()
    (tmp_path / "huge.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 64)
    with pytest.raises(CheckpointError, match="huge.safetensors is not a readable safetensors file"):
        import_file(tmp_path / "huge.safetensors")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError):
        import_file(tmp_path / "notes.txt")
    import io
    import zipfile
    from numpy.lib import format as npformat
    header = io.BytesIO()                                   # an .npy header claiming 2**40 floats, 16 bytes of data
    npformat.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2 ** 40,)})
    with zipfile.ZipFile(tmp_path / "bomb.npz", "w") as zf:
        zf.writestr("pos_embed.npy", header.getvalue() + b"\0" * 16)
    with pytest.raises(CheckpointError, match="claims 4,398,046,511,104 bytes"):
        import_file(tmp_path / "bomb.npz")


@pytest.mark.parametrize("suffix, what", [(".safetensors", "not a readable safetensors file"),
                                          (".npz", "not a readable .npz file"),
                                          (".pth", "not a readable PyTorch weights file"),
                                          (".bin", "not a readable PyTorch weights file")])
@pytest.mark.parametrize("content", [bytes(range(256)) * 40, b"just some notes, not weights\n" * 20])
def test_a_junk_file_is_named_as_its_owner_knows_it_in_plain_words(tmp_path, suffix, what, content):
    """Issue 31: random bytes or a text file renamed to a weights suffix said "cannot read
    vitpe-import-fsw_l77w.safetensors as a state dict of tensors: Error while deserializing
    header: header too large": a temporary file's name and the parser's own message."""
    path = tmp_path / f"vitpe-import-x1y2{suffix}"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as err:
        import_file(path, name=f"vit{suffix}")
    text = str(err.value)
    assert text.startswith(f"vit{suffix} is {what}") and "again with" in text, text
    assert "vitpe-import-" not in text and "deserializ" not in text.lower() and "header too large" not in text


def test_a_pickle_of_objects_is_refused_saying_why_and_an_empty_file_is_named(tmp_path):
    import io

    buf = io.BytesIO()
    torch.save({"model": torch.nn.Linear(2, 2)}, buf)          # a whole module: pickled objects, not tensors
    (tmp_path / "m.pth").write_bytes(buf.getvalue())
    with pytest.raises(CheckpointError, match="m.pth holds pickled Python objects.*would run code.*state_dict"):
        import_file(tmp_path / "m.pth")
    (tmp_path / "e.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"e.safetensors is empty \(0 bytes\)"):
        import_file(tmp_path / "e.safetensors")


def test_the_cli_says_what_is_wrong_with_a_junk_file_in_one_line(tmp_path, capsys):
    from vitpe_core.__main__ import main
    (tmp_path / "vit.safetensors").write_bytes(b"not a weights file\n" * 10)
    assert main(["import", str(tmp_path / "vit.safetensors"), "--out", str(tmp_path / "o.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: vit.safetensors is not a readable safetensors file") and err.count("\n") == 1
    assert "Error while" not in err and not (tmp_path / "o.safetensors").exists()


# ----------------------------------------------------------------------------- class names
def _labelled(tmp_path, labels: str, suffix: str, capsys):
    from vitpe_core.__main__ import main
    save_file(_timm_sd(), str(tmp_path / "w.safetensors"))             # 7 classes
    (tmp_path / f"labels{suffix}").write_text(labels, encoding="utf-8")
    out = tmp_path / "mine.safetensors"
    rc = main(["import", str(tmp_path / "w.safetensors"), "--out", str(out), "--heads", str(HEADS),
               "--labels", str(tmp_path / f"labels{suffix}")])
    return rc, out, capsys.readouterr()


SEVEN = ["tench", "goldfish", "great white shark", "tiger shark", "hammerhead", "electric ray", "stingray"]


def test_cli_labels_from_a_text_file_one_name_per_line(tmp_path, capsys):
    rc, out, io = _labelled(tmp_path, "\n".join(SEVEN) + "\n\n", ".txt", capsys)
    assert rc == 0, io.err
    assert json.loads(io.out)["first_class_names"] == SEVEN[:3]
    assert load_checkpoint(out).metrics["class_names"] == SEVEN


def test_cli_labels_from_json_as_config_json_id2label(tmp_path, capsys):
    id2label = {str(i): n for i, n in reversed(list(enumerate(SEVEN)))}   # key order does not matter
    rc, out, io = _labelled(tmp_path, json.dumps(id2label), ".json", capsys)
    assert rc == 0, io.err
    assert load_checkpoint(out).metrics["class_names"] == SEVEN
    rc, out, io = _labelled(tmp_path, json.dumps({"architectures": ["ViT"], "id2label": id2label}), ".json", capsys)
    assert rc == 0 and load_checkpoint(out).metrics["class_names"] == SEVEN      # a whole config.json


@pytest.mark.parametrize("labels, suffix, message", [
    ("\n".join(SEVEN[:5]), ".txt", "labels.txt names 5 classes, but the model's head has 7 outputs"),
    (json.dumps({str(i): "x" for i in range(10)}), ".json", "labels.json names 10 classes, but the model's head has 7"),
    (json.dumps({"0": "a", "2": "b"}), ".json", "must run from 0 to 1 without gaps"),
    (json.dumps({"tench": 0}), ".json", "keys must be class indices"),
    ("{not json", ".json", "looks like JSON but does not parse"),
    ("a\n\nb\nc\nd\ne\nf\ng", ".txt", "class 1 has an empty name"),
    ("", ".txt", "labels.txt is empty"),
])
def test_cli_refuses_labels_that_do_not_fit_the_model(tmp_path, capsys, labels, suffix, message):
    rc, out, io = _labelled(tmp_path, labels, suffix, capsys)
    assert rc == 2 and message in io.err and not out.exists(), io.err


def test_labels_for_a_model_without_a_head_and_a_missing_labels_file_are_refused(tmp_path):
    sd = {k: v for k, v in _timm_sd().items() if not k.startswith("head.")}
    with pytest.raises(CheckpointError, match="no classification head"):
        import_state_dict(sd, heads=HEADS, class_names=SEVEN)
    save_file(_timm_sd(), str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match="no labels file at"):
        import_file(tmp_path / "w.safetensors", labels=tmp_path / "missing.txt")
    imp = import_state_dict(_timm_sd(), heads=HEADS)                      # no names: said, with what to do
    assert imp.class_names is None and any("labels file" in n for n in imp.notes)


def test_a_hub_id_without_network_says_which_file_to_download(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_hub(name, *args, **kw):
        if name == "huggingface_hub":
            raise ImportError(name)
        return real_import(name, *args, **kw)
    monkeypatch.setattr(builtins, "__import__", no_hub)
    with pytest.raises(CheckpointError, match=r"download `model.safetensors`.*huggingface.co/google/vit-base"):
        import_file("google/vit-base-patch16-224")


def test_cli_import_of_the_real_vit_tiny_scores_057(shared_dir, tmp_path, capsys):
    from vitpe_core.__main__ import main
    out = tmp_path / "vit_tiny.safetensors"
    src = shared_dir / "data" / "vit_tiny_patch16_224_tinyimagenet_ft.npz"
    assert main(["import", str(src), "--out", str(out), "--licence", "research use"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line["grid"] == [14, 14] and line["classes"] == 200 and line["prefix_tokens"] == ["CLS"]
    ckpt = load_checkpoint(out)
    score = analysis.structure_score(analysis.cosine_similarity(analysis.position_table(ckpt.model)), (14, 14))
    assert score["spearman"] == pytest.approx(0.573, abs=0.002)
    assert np.isfinite(ckpt.model(torch.randn(1, 3, 224, 224)).detach().numpy()).all()


def test_explore_load_takes_every_format_the_importer_takes(tmp_path):
    """The notebook API's `load` reads a timm `.npz` (and a `.pth`) as the app and the CLI do,
    instead of refusing it as an unreadable safetensors file (issue 44, item 4)."""
    from vitpe_core import ViTConfig, build_model, explore

    cfg = ViTConfig(img_size=(16, 16), patch_size=4, dim=32, depth=1, heads=2, mlp_dim=32, num_classes=3)
    torch.manual_seed(0)
    sd = {("pos_embed" if k.endswith("pos_embed") else k): v for k, v in build_model(cfg).state_dict().items()}
    np.savez(tmp_path / "vit_tiny.npz", **{k: v.numpy() for k, v in sd.items()})
    torch.save(sd, tmp_path / "vit_tiny.pth")
    x = torch.randn(1, 3, 16, 16)
    outs = []
    for name in ("vit_tiny.npz", "vit_tiny.pth"):
        model = explore.load(tmp_path / name)
        assert model.ckpt.model.cfg.grid == (4, 4)
        outs.append(model.ckpt.model.eval()(x))
    torch.testing.assert_close(outs[0], outs[1])
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="expected a .safetensors"):
        explore.load(tmp_path / "notes.txt")
