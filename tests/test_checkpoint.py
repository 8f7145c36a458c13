"""Checkpoint format, strict loading with clear errors, safe paths; foreign files are refused
(and read only by `foreign`, for the importer, without running code)."""
from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vitpe_core import ViTConfig, build_model
from vitpe_core import analysis as A
from vitpe_core.checkpoint import (CheckpointError, NotVitpeCheckpointError, history_params, list_checkpoints,
                                   load_checkpoint, read_config, resolve_checkpoint, save_checkpoint, update_metrics)
from vitpe_core.foreign import read_state_dict
from vitpe_core.importers import import_file, import_state_dict


def tiny_cfg(encoding="sape2+ape") -> ViTConfig:
    return ViTConfig(img_size=(12, 20), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=48, encoding=encoding)


def test_roundtrip_config_weights_metrics_history(tmp_path):
    model = build_model(tiny_cfg()).eval()
    hist = {0: history_params(model), 3: history_params(model)}
    path = save_checkpoint(tmp_path / "m.safetensors", model, metrics={"test": {"top1": 12.5}}, history=hist,
                           dtype=torch.float32)
    ck = load_checkpoint(path)
    assert ck.config == model.cfg and ck.metrics == {"test": {"top1": 12.5}} and ck.name == "m"
    assert sorted(ck.history) == [0, 3] and set(ck.history[3]) == set(dict(model.pos_enc.named_parameters()))
    x = torch.randn(2, 3, 12, 20)
    with torch.no_grad():
        torch.testing.assert_close(ck.model(x), model(x))
    side = json.loads((tmp_path / "m.json").read_text())
    assert side["metrics"]["test"]["top1"] == 12.5 and side["config"]["encoding"] == "sape2+ape"
    update_metrics(path, {"resolution": {"24": {"top1": 1.0}}})
    assert load_checkpoint(path).metrics["resolution"]["24"]["top1"] == 1.0


def test_fp16_storage_keeps_outputs_close(tmp_path):
    model = build_model(tiny_cfg("ape")).eval()
    ck = load_checkpoint(save_checkpoint(tmp_path / "h.safetensors", model))
    x = torch.randn(4, 3, 12, 20)
    with torch.no_grad():
        torch.testing.assert_close(ck.model(x), model(x), atol=5e-3, rtol=5e-3)


def test_compile_and_ddp_prefixes_are_stripped(tmp_path):
    model = build_model(tiny_cfg("ape"))
    wrapped = torch.nn.Module()
    wrapped._orig_mod = model
    sd = {f"module._orig_mod.{k}": v for k, v in model.state_dict().items()}
    from vitpe_core.checkpoint import clean_state_dict
    assert set(clean_state_dict(sd)) == set(model.state_dict())


@pytest.fixture
def saved(tmp_path) -> Path:
    return save_checkpoint(tmp_path / "good.safetensors", build_model(tiny_cfg()), metrics={})


def test_truncated_file_is_refused(saved):
    data = saved.read_bytes()
    saved.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(saved)


def test_non_vitpe_safetensors_is_refused_and_pointed_at_the_importer(tmp_path):
    save_file({"x": torch.zeros(2)}, tmp_path / "other.safetensors")
    with pytest.raises(NotVitpeCheckpointError, match="not a vitpe checkpoint.*python -m vitpe_core import"):
        load_checkpoint(tmp_path / "other.safetensors")


def _rewrite(path: Path, *, meta_update=None, tensors_update=None, drop=None):
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    meta.update(meta_update or {})
    tensors.update(tensors_update or {})
    for k in drop or []:
        tensors.pop(k)
    save_file(tensors, path, metadata=meta)


def test_other_format_version_is_refused(saved):
    _rewrite(saved, meta_update={"format_version": "99"})
    with pytest.raises(CheckpointError, match="version '99'"):
        load_checkpoint(saved)


def test_unknown_encoding_is_refused_with_valid_names(saved):
    cfg = json.loads(json.dumps(tiny_cfg().to_dict()))
    cfg["encoding"] = "sape9"
    _rewrite(saved, meta_update={"config": json.dumps(cfg)})
    with pytest.raises(CheckpointError, match="unknown encoding.*valid"):
        load_checkpoint(saved)


def test_wrong_shape_and_missing_and_unexpected_keys_are_named(saved):
    _rewrite(saved, tensors_update={"head.weight": torch.zeros(3, 32, dtype=torch.float16),
                                    "surprise": torch.zeros(1)}, drop=["norm.bias"])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(saved)
    msg = str(e.value)
    assert "head.weight" in msg and "norm.bias" in msg and "surprise" in msg


def test_read_config_reads_the_header_alone_and_refuses_what_load_refuses(saved, tmp_path):
    assert read_config(saved) == load_checkpoint(saved).config == tiny_cfg()
    _rewrite(saved, tensors_update={"head.weight": torch.zeros(3, 32, dtype=torch.float16)})
    assert read_config(saved) == tiny_cfg()      # a weight that does not fit: only loading finds it
    with pytest.raises(CheckpointError, match="head.weight"):
        load_checkpoint(saved)
    save_file({"x": torch.zeros(2)}, tmp_path / "other.safetensors")
    for path, message in ((tmp_path / "other.safetensors", "not a vitpe checkpoint"),
                          (tmp_path / "nope.safetensors", "no checkpoint")):
        with pytest.raises(CheckpointError, match=message):
            read_config(path)
    cfg = {**tiny_cfg().to_dict(), "encoding": "sape9"}
    _rewrite(saved, meta_update={"config": json.dumps(cfg)})
    with pytest.raises(CheckpointError, match="unknown encoding"):
        read_config(saved)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nope.safetensors")


class _RunsCode:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_pickle_that_runs_code_is_refused_and_does_not_run(tmp_path):
    marker = tmp_path / "pwned"
    evil = tmp_path / "evil.pth"
    with open(evil, "wb") as f:
        pickle.dump({"model": _RunsCode(marker)}, f)
    with pytest.raises(CheckpointError):
        read_state_dict(evil)
    with pytest.raises(CheckpointError):
        import_file(evil)
    evil_st = tmp_path / "evil.safetensors"
    evil_st.write_bytes(evil.read_bytes())
    with pytest.raises(CheckpointError):
        load_checkpoint(evil_st)
    assert not marker.exists()


def test_resolve_only_inside_the_folder(tmp_path):
    root = tmp_path / "checkpoints"
    root.mkdir()
    save_checkpoint(root / "ape.safetensors", build_model(tiny_cfg("ape")))
    outside = tmp_path / "secret.safetensors"
    outside.write_bytes(b"secret")
    (root / "link.safetensors").symlink_to(outside)
    assert resolve_checkpoint("ape", root) == (root / "ape.safetensors").resolve()
    for bad in ["../secret", "../../etc/passwd", "/etc/passwd", str(outside), "link", ".hidden", "a/b", "", "x" * 500,
                "ape\x00", "..", "missing"]:
        with pytest.raises(CheckpointError):
            resolve_checkpoint(bad, root)
    assert list_checkpoints(root) == ["ape"]


def test_timm_state_dict_loads_directly_into_ape():
    cfg = ViTConfig(img_size=(16, 16), patch_size=4, dim=32, depth=2, heads=2, mlp_dim=48, encoding="ape")
    src = build_model(cfg)
    sd = src.state_dict()
    sd["pos_embed"] = sd.pop("pos_enc.pos_embed")   # timm's key
    dst = build_model(cfg)
    dst.load_state_dict(sd)                           # direct, strict
    assert torch.equal(dst.pos_enc.pos_embed, src.pos_enc.pos_embed)
    assert import_state_dict(sd, family="timm").model.cfg.grid == (4, 4)


def test_a_checkpoint_with_timm_table_key_is_not_a_vitpe_checkpoint(tmp_path):
    """Checkpoint loading knows only vitpe's own keys (`pos_enc.*`); timm's `pos_embed` is the importer's."""
    from vitpe_core.checkpoint import read_checkpoint_file
    path = save_checkpoint(tmp_path / "m.safetensors", build_model(tiny_cfg("ape")))
    meta, tensors = read_checkpoint_file(path)
    tensors["pos_embed"] = tensors.pop("pos_enc.pos_embed")
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match=r"missing keys \['pos_enc.pos_embed'\]; unexpected keys \['pos_embed'\]"):
        load_checkpoint(path)


@pytest.mark.shared
def test_import_real_timm_vit_tiny_shows_row_column_structure(shared_dir):
    path = shared_dir / "data" / "vit_tiny_patch16_224_tinyimagenet_ft.npz"
    model = import_file(path).model
    assert model.cfg.grid == (14, 14) and model.cfg.heads == 3 and model.cfg.num_classes == 200
    sim = A.cosine_similarity(A.position_table(model))
    score = A.structure_score(sim, (14, 14))
    assert score["spearman"] > 0.4
    assert score["same_row"] > score["other"] + 0.3 and score["same_col"] > score["other"] + 0.3
    grid = A.similarity_grid(sim, (14, 14))
    assert grid[5, 5, 5, 5] == pytest.approx(1.0, abs=1e-5)
    with torch.no_grad():
        out = model(torch.randn(1, 3, 224, 224))
    assert out.shape == (1, 200) and torch.isfinite(out).all()


# ----------------------------------------------------------------------------- `structure` CLI
def _structure_cli(path, capsys) -> tuple[int, str, str]:
    from vitpe_core.__main__ import main
    capsys.readouterr()
    rc = main(["structure", str(path)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_structure_cli_scores_vitpe_and_timm_tables_alike(tmp_path, capsys):
    cfg = ViTConfig(img_size=(16, 24), patch_size=4, dim=32, depth=1, heads=2, mlp_dim=48, encoding="ape")
    model = build_model(cfg).eval()
    with torch.no_grad():  # a table with exact row/column structure: one-hot row + one-hot column
        table = torch.zeros(4 * 6, 32)
        for i in range(4):
            for j in range(6):
                table[i * 6 + j, i] = table[i * 6 + j, 8 + j] = 1.0
        model.pos_enc.pos_embed[:, 1:].copy_(table[None])  # row 0 is the class token's
    save_checkpoint(tmp_path / "ape.safetensors", model)
    rc, out, _ = _structure_cli(tmp_path / "ape.safetensors", capsys)
    score = json.loads(out)
    assert rc == 0 and score["encoding"] == "ape" and score["grid"] == [4, 6]
    assert score["same_row"] == pytest.approx(0.5) and score["same_col"] == pytest.approx(0.5)
    assert score["other"] == pytest.approx(0.0) and score["spearman"] > 0.35   # 0.42 for this 3-level table

    sd = {k: v.contiguous() for k, v in model.state_dict().items()}  # the same weights under timm's key
    sd["pos_embed"] = sd.pop("pos_enc.pos_embed")
    sq = {**sd, "pos_embed": torch.cat([sd["pos_embed"][:, :1], torch.randn(1, 16, 32)], 1)}
    save_file(sq, str(tmp_path / "timm.safetensors"))
    rc, out, _ = _structure_cli(tmp_path / "timm.safetensors", capsys)
    assert rc == 0 and json.loads(out)["grid"] == [4, 4]           # timm's square-grid default

    save_file(sd, str(tmp_path / "wide.safetensors"))                  # 24 rows: not square
    rc, _, err = _structure_cli(tmp_path / "wide.safetensors", capsys)
    assert rc == 2 and "--grid" in err
    from vitpe_core.__main__ import main
    assert main(["structure", str(tmp_path / "wide.safetensors"), "--grid", "4x6"]) == 0
    assert json.loads(capsys.readouterr().out)["spearman"] == pytest.approx(score["spearman"], abs=1e-4)


def test_structure_cli_says_why_it_cannot_score(tmp_path, capsys):
    save_checkpoint(tmp_path / "rpb.safetensors", build_model(tiny_cfg("rpb")))
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "junk.pth").write_bytes(b"\x80\x04junk")
    cases = {"rpb.safetensors": "no position table", "notes.txt": "expected timm weights",
             "junk.pth": "neither a vitpe checkpoint", "missing.npz": "no file at"}
    for name, message in cases.items():
        rc, out, err = _structure_cli(tmp_path / name, capsys)
        assert rc == 2 and out == "" and message in err and "Traceback" not in err, (name, err)


@pytest.mark.shared
def test_structure_cli_reproduces_the_readme_figure_for_timm_vit_tiny(shared_dir, capsys):
    rc, out, _ = _structure_cli(shared_dir / "data" / "vit_tiny_patch16_224_tinyimagenet_ft.npz", capsys)
    assert rc == 0 and round(json.loads(out)["spearman"], 2) == 0.57   # "a pretrained timm ViT-Tiny scores 0.57"


@pytest.mark.parametrize("key, shape", [("history.x.pos_enc_param", None), ("history.1.nope", (3,)),
                                        ("history.1.<first>", (1, 2))])
def test_altered_history_is_refused_with_a_reason(tmp_path, key, shape):
    from vitpe_core.checkpoint import read_checkpoint_file
    model = build_model(tiny_cfg("ape"))
    path = save_checkpoint(tmp_path / "m.safetensors", model, history={1: history_params(model)})
    meta, tensors = read_checkpoint_file(path)
    first = next(k for k in tensors if k.startswith("history.1."))
    key = key.replace("<first>", first[len("history.1."):])
    tensors[key] = torch.zeros(shape or tensors[first].shape)
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match="history entry"):
        load_checkpoint(path)


@pytest.mark.parametrize("change, message", [
    ({"dim": 65536, "heads": 2}, "describes a model of about"),          # would allocate tens of GB
    ({"img_size": [40000, 40000]}, "describes a model of about"),
    ({"depth": 0}, "positive integers"), ({"heads": 0}, "positive integers"), ({"patch_size": -4}, "positive"),
    ({"encoding_options": {"npos_max": 10**9}}, "npos_max must be an integer from 2 to"),
    ({"encoding_options": {"npos_max": "10"}}, "npos_max must be an integer"),
])
def test_forged_config_is_refused_before_anything_large_is_built(tmp_path, change, message):
    from vitpe_core.checkpoint import read_checkpoint_file
    path = save_checkpoint(tmp_path / "m.safetensors", build_model(tiny_cfg("sape2+ape")))
    meta, tensors = read_checkpoint_file(path)
    meta["config"] = json.dumps({**json.loads(meta["config"]), **change})
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(path)


@pytest.fixture(scope="module")
def bare_elements() -> dict[str, int]:
    """Values in each preset's model without an encoding: every preset (ViT-S included) built once."""
    from vitpe_core.config import PRESETS
    return {name: sum(t.numel() for t in build_model(ViTConfig(**preset, encoding="none")).state_dict().values())
            for name, preset in PRESETS.items()}


@pytest.mark.parametrize("enc", ["ape", "sape2+ape", "cope+ape", "rpb", "rope_mixed", "none"])
def test_size_estimate_matches_real_models(bare_elements, enc):
    """A model's values are the bare model's plus its encoding's (`pos_enc` is all that differs)."""
    from vitpe_core.checkpoint import approx_elements
    from vitpe_core.config import PRESETS
    from vitpe_core.encodings import EncodingContext, build_encoding
    for name, preset in PRESETS.items():
        cfg = ViTConfig(**preset, encoding=enc)
        pos_enc = build_encoding(enc, EncodingContext(cfg.dim, cfg.heads, cfg.depth, cfg.grid))
        real = bare_elements[name] + sum(t.numel() for t in pos_enc.state_dict().values())
        if name == "tiny":   # the sum itself, checked where a whole build is cheap
            assert real == sum(t.numel() for t in build_model(cfg).state_dict().values())
        assert 0.5 < approx_elements(cfg) / real < 2, (name, enc)


def test_listed_names_split_into_group_and_stem_only_for_a_group(tmp_path):
    from vitpe_core.checkpoint import group_and_stem, in_group, listed_checkpoints
    assert group_and_stem("long/ape") == ("long", "ape") and in_group("long/ape")
    assert group_and_stem("ape") == ("", "ape")
    assert group_and_stem("seeds/ape-seed1") == ("", "seeds/ape-seed1") and not in_group("seeds/ape-seed1")
    for folder in (tmp_path, tmp_path / "long", tmp_path / "seeds"):
        folder.mkdir(exist_ok=True)
        (folder / "ape.safetensors").write_bytes(b"")
    assert listed_checkpoints(tmp_path) == ["ape", "long/ape"]              # seeds/ is not a listed group


def test_a_junk_checkpoint_file_gets_a_plain_message(tmp_path):
    """Random bytes named `.safetensors` in the checkpoints folder: a message that says what to
    do, not safetensors' own ("Error while deserializing header: ...")."""
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(bytes(range(256)) * 64)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(junk)
    text = str(err.value)
    assert text.startswith("junk.safetensors is not a readable safetensors file") and "save the model again" in text
    assert "deserializ" not in text.lower() and "header too large" not in text.lower()
