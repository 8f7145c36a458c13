"""timm-layout imports at another input size give what timm gives at that size (issue 46, timm half).

Against timm 1.0.31 itself (scripts/make_import_references.py `--only sizes`, run in a side
environment; tests/data/import_references_sizes_timm.safetensors): one small random-weight case per
timm-layout family (plain ViT with a CLS row in its table; registers + a patches-only non-square
table; BEiT with per-layer and with shared tables + `pos_embed`; CLIP; SigLIP; EVA-02 on a reference
grid; DINOv3; Swin; Swin-V2), its state dict and timm's `config.json`, and at a larger square size and
a rectangular one timm's logits by its two paths:

* `filter`: the model created at that size, the native state dict through the model module's own
  `checkpoint_filter_fn` -- vitpe's import with `img_size=`;
* `dynamic`: the native model built with `dynamic_img_size=True`, run on the other size -- vitpe's
  native import run on it (the encodings resize their tables at run time). timm's `Beit` has no
  `dynamic_img_size`: there the native import run on the other size is held to the `filter` logits
  (its tables resize by the same geometric rule at run time).

Both within 1e-5 relative. What remains refused is refused by name: timm's Swin at a size where it
computes otherwise (a shifted stage with per-axis windows; a Swin table timm would resize).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vitpe_core.checkpoint import CheckpointError, load_checkpoint
from vitpe_core.encodings import EncodingContext, build_encoding
from vitpe_core.encodings.rpb import RelativePositionBiasCLS, resize_rel_table
from vitpe_core.importers import import_file

REFS = Path(__file__).parent / "data" / "import_references_sizes_timm.safetensors"
if not REFS.exists():
    pytest.skip(f"{REFS.name} is missing: run scripts/make_import_references.py --only sizes in a side environment "
                "with timm 1.0.31", allow_module_level=True)

from test_importers import _refs, case_folder, case_state_dict   # noqa: E402  (after the skip: these read the reference files)
from test_importers_timm_families import _close       # noqa: E402

META, CASES = _refs(REFS)
REL = 1e-5
SIZES = [(case, tag) for case in META for tag in META[case]["sizes"]]
# timm computes these otherwise than vitpe's Swin (timm_swin.check_windows and the table check): refused by name
REFUSED = {
    ("swin_shift_clamped", "sq"): r"stage 2's relative_position_bias_table covers 2x2 windows.*would cover 4x4",
    ("swin_shift_clamped", "rect"): r"stage 1 \(4x8 tokens\): timm's windows there are 4x4 shifted by \[0, 2\]",
    ("swinv2_shift_clamped", "rect"): r"stage 1 \(4x8 tokens\): timm's windows there are 4x4 shifted by \[0, 2\]",
}


def _sd(case: str) -> dict[str, torch.Tensor]:
    return case_state_dict(CASES, case)


def _folder(case: str, tmp_path: Path, config: dict | None = None) -> Path:
    return case_folder(META, CASES, case, tmp_path, config)


def _x(case: str, tag: str) -> torch.Tensor:
    return CASES[case][f"x.{tag}"].float()   # stored as float16; timm ran on exactly these values


def _size(case: str, tag: str) -> str:
    h, w = META[case]["sizes"][tag]
    return f"{h}x{w}"


def _check(model, case: str, tag: str, path: str) -> float:
    """The logits of the trace and the fast path against timm's by `path` at size `tag`."""
    ref = CASES[case][f"{path}.{tag}"]
    with torch.no_grad():
        traced = model(_x(case, tag), trace=[])
        fast = model(_x(case, tag))
    return max(_close(traced, ref, REL), _close(fast, ref, REL))


@pytest.mark.parametrize("case, tag", SIZES)
def test_imported_at_another_size_equals_timms_model_created_at_it(case, tag, tmp_path):
    """`img_size=` resamples at import as timm's `checkpoint_filter_fn` does for a model created at that size."""
    path = _folder(case, tmp_path)
    if (case, tag) in REFUSED:
        with pytest.raises(CheckpointError, match=REFUSED[case, tag]):
            import_file(path, img_size=_size(case, tag))
        return
    imp = import_file(path, img_size=_size(case, tag))
    assert imp.family == META[case]["family"]
    _check(imp.model, case, tag, "filter")
    assert not [n for n in imp.notes if "differ" in n], imp.notes


@pytest.mark.parametrize("case, tag", SIZES)
def test_the_native_import_run_at_another_size_equals_timms_dynamic_size(case, tag, tmp_path):
    """The encodings resize their tables at run time as timm's `dynamic_img_size=True` does (timm's BEiT has
    none: as its model created at that size)."""
    model = import_file(_folder(case, tmp_path)).model
    path = "dynamic" if "dynamic" in META[case]["paths"] else "filter"
    if case == "swin_shift_clamped" and tag == "sq":   # stage 2's table covers 2x2 windows, not 4x4: refused or exact
        try:
            _check(model, case, tag, path)
        except ValueError as e:
            assert re.search(r"window of 4 needs offsets beyond this block's table", str(e))
        return
    _check(model, case, tag, path)


def _rpb(model) -> RelativePositionBiasCLS:
    return next(m for m in model.modules() if isinstance(m, RelativePositionBiasCLS))


@pytest.mark.parametrize("case", ["beit_layer_bias_mean", "beit_shared_bias_ape_token"])
def test_timm_beit_resizes_its_tables_by_beits_geometric_rule_at_import_and_at_run_time(case, tmp_path):
    native = import_file(_folder(case, tmp_path))
    assert native.model.cfg.encoding_options["table_resize"] == _rpb(native.model).table_resize == "geometric"
    assert not [n for n in native.notes if "geometric" in n]   # nothing resized at the native size
    h, w = META[case]["sizes"]["rect"]
    imp = import_file(_folder(case, tmp_path), img_size=f"{h}x{w}")
    assert (f"The relative position tables were trained on a 4x4 grid; resized to {h // 8}x{w // 8} by BEiT's "
            "geometric interpolation, as timm's checkpoint filter does.") in imp.notes
    rel = _rpb(native.model).rel_tables.detach()
    want = torch.stack([resize_rel_table(t, (h // 8, w // 8), mode="geometric") for t in rel])
    assert torch.equal(_rpb(imp.model).rel_tables.detach(), want)
    assert torch.equal(_rpb(imp.model).cls_bias.detach(), _rpb(native.model).cls_bias.detach())


def test_a_stored_timm_beit_keeps_its_run_time_rule(tmp_path):
    """The option is in the stored config: the checkpoint run at another size still equals timm."""
    from vitpe_core.__main__ import main
    case = "beit_layer_bias_mean"
    out = tmp_path / "beit.safetensors"
    assert main(["import", str(_folder(case, tmp_path)), "--out", str(out)]) == 0
    ckpt = load_checkpoint(out)
    assert ckpt.model.cfg.encoding_options == {"table_resize": "geometric"}
    for tag in META[case]["sizes"]:
        _check(ckpt.model, case, tag, "filter")


def test_rpb_cls_resizes_bilinearly_unless_told(tmp_path):
    """The default (Hugging Face BEiT / data2vec-vision, every existing checkpoint) is unchanged."""
    ctx = EncodingContext(dim=16, heads=2, depth=2, grid=(4, 4))
    torch.manual_seed(0)
    default = build_encoding("rpb_cls", ctx)
    assert default.table_resize == "bilinear"
    geometric = build_encoding("rpb_cls", ctx, table_resize="geometric")
    geometric.load_state_dict(default.state_dict())
    for grid in ((6, 6), (3, 5)):
        for layer in range(2):
            t = default.rel_tables[layer]
            assert torch.equal(default.offset_table(grid, layer), resize_rel_table(t, grid, mode="bilinear"))
            assert torch.equal(geometric.offset_table(grid, layer), resize_rel_table(t, grid, mode="geometric"))
    with pytest.raises(ValueError, match="table_resize must be one of"):
        build_encoding("rpb_cls", ctx, table_resize="nearest")


def test_a_non_square_table_at_another_size_needs_timms_config(tmp_path):
    """Its rows fit no square grid: the grid it was trained on comes from timm's config.json (model_args.img_size);
    without it, refused asking for the size."""
    case = "timm_reg4_noembed_ls_nonsquare"
    imp = import_file(_folder(case, tmp_path), img_size="40x40")
    assert imp.model.cfg.grid == (5, 5)
    assert any("trained on a 3x5 grid; resampled to 5x5" in n for n in imp.notes)
    with pytest.raises(CheckpointError, match="15 rows with 5 prefix token.*--img-size"):
        import_file(_folder(case, tmp_path, config={}), img_size="40x40", heads=2)
