"""The app's newer views through app.py in AppTest: the Figure-7 film on the similarity page,
the figure download format (PNG / SVG), the per-query kernels on the compare page, the
`long/` group of checkpoints and the compare page's pick of them, and the encoding-scale chart on the Checkpoints page.
Checkpoints: tiny random-weight models (`benchmarks.harness.write_random_checkpoints`)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import unquote

import pytest
from streamlit.testing.v1 import AppTest

from benchmarks.harness import write_random_checkpoints
from vitpe_core.checkpoint import load_checkpoint, save_checkpoint
from vitpe_core.viewstate import PAGES

APP = str(Path(__file__).resolve().parents[1] / "app.py")


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """ape, sape2+ape, rpb and none (history epochs 0-3), `long/ape` (a copy of ape) and
    `seeds/none-seed1` (not listed); sape2+ape's curves carry an encoding-scale record."""
    root = write_random_checkpoints(tmp_path_factory.mktemp("ckpts"), ("ape", "sape2+ape", "rpb", "none"), epochs=3)
    (root / "long").mkdir()
    (root / "seeds").mkdir()
    for sub, name in (("long", "ape"), ("seeds", "none-seed1")):
        for suffix in (".safetensors", ".json"):
            shutil.copy(root / f"{name.split('-')[0]}{suffix}", root / sub / f"{name}{suffix}")
    ckpt = load_checkpoint(root / "sape2+ape.safetensors")
    curves = dict(ckpt.metrics["curves"])
    curves.update({"enc_bias_ratio_L0": [None, 0.02, 0.05], "enc_bias_ratio_L1": [0.01, 0.03, 0.08],
                   "enc_ex_norm_L0": [0.1, 0.2, 0.3], "enc_ex_norm_L1": [0.1, 0.1, 0.2],
                   "enc_ey_norm_L0": [0.1, 0.2, 0.2], "enc_ey_norm_L1": [0.1, 0.3, 0.4]})
    save_checkpoint(root / "sape2+ape.safetensors", ckpt.model, metrics={**ckpt.metrics, "curves": curves},
                    history=ckpt.history)
    return root


@pytest.fixture
def ckpts(folder, monkeypatch):
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(folder))
    return folder


def run(params: dict | None = None, session: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=90)
    for k, v in (params or {}).items():
        at.query_params[k] = v
    for k, v in (session or {}).items():
        at.session_state[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def chart(at: AppTest, key: str):
    [c] = [c for c in at.get("plotly_chart") if c.proto.id.endswith(key) or getattr(c, "key", None) == key]
    return json.loads(c.proto.spec), json.loads(c.proto.config)


def formats(at: AppTest) -> list[str]:
    """The camera button's format of every chart drawn through `output.chart` (the patch picker, a
    Plotly chart to click, has no camera button)."""
    configs = [json.loads(c.proto.config) for c in at.get("plotly_chart")]
    return [c["toImageButtonOptions"]["format"] for c in configs if "toImageButtonOptions" in c]


# ----------------------------------------------------------------------------- film
def test_the_similarity_page_plays_the_table_over_every_recorded_epoch(ckpts):
    at = run({"page": "similarity", "ckpt": "ape"})
    spec, _ = chart(at, "similarity_film")
    assert [f["name"] for f in spec["frames"]] == ["0", "1", "2", "3"]
    assert [s["label"] for s in spec["layout"]["sliders"][0]["steps"]] == ["0", "1", "2", "3"]
    [gif] = [b for b in at.get("download_button") if "GIF" in b.proto.label]
    assert "4 epochs" in gif.proto.label and gif.proto.id.endswith("similarity_film_gif")


# ----------------------------------------------------------------------------- PNG or SVG
def test_the_camera_button_saves_the_format_chosen_in_the_sidebar(ckpts):
    at = run({"page": "similarity", "ckpt": "ape"})
    [radio] = [r for r in at.sidebar.radio if r.key == "figure_format"]
    assert radio.value == "png" and radio.options == ["PNG", "SVG"]
    before = formats(at)
    assert len(before) >= 3 and set(before) == {"png"}
    radio.set_value("svg").run()
    assert not at.exception
    assert formats(at) == ["svg"] * len(before)
    assert at.session_state["_vitpe_figure_format"] == "svg"
    at.switch_page("pages/compare.py").run()                           # set once: every page, every chart
    assert not at.exception
    assert len(formats(at)) >= 3 and set(formats(at)) == {"svg"}


# ----------------------------------------------------------------------------- per-query kernels
def test_compare_draws_each_checkpoints_kernel_row_of_the_query_patch(ckpts):
    at = run({"page": "compare", "patch": "1,2"})
    spec, cfg = chart(at, "compare_query_kernels")
    titles = [a["text"] for a in spec["layout"]["annotations"]]
    assert {t.split(" · ")[0] for t in titles} >= {"ape", "sape2+ape", "rpb"} and not any("none" in t for t in titles)
    rpb = next(t for t in titles if t.startswith("rpb"))
    assert rpb == "rpb · fit 1.00"                                           # a relative bias fits every query
    rects = [s for s in spec["layout"]["shapes"] if s["type"] == "rect"]
    assert all((s["x0"], s["y0"]) == (1.5, 0.5) for s in rects)            # the query (1, 2) outlined
    assert "p1-2" in cfg["toImageButtonOptions"]["filename"]
    at2 = run({"page": "compare", "patch": "6,0"})
    spec2, _ = chart(at2, "compare_query_kernels")
    assert spec2["data"][0]["z"] != spec["data"][0]["z"]


# ----------------------------------------------------------------------------- long/ group
def test_long_checkpoints_are_a_second_group_and_seeds_are_not_listed(ckpts):
    from pages.common import cache
    assert cache.checkpoint_names() == ["ape", "none", "rpb", "sape2+ape", "long/ape"]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_and_share_link_work_with_a_long_checkpoint(ckpts, page):
    at = run({"page": page, "ckpt": "long/ape"})
    assert not at.warning, [w.value for w in at.warning]
    assert at.session_state["ckpt"] == "long/ape"
    [link] = [c.value for c in at.sidebar.code]
    assert "ckpt=long%2Fape" in link and "long/ape" in unquote(link)
    if page == "checkpoints":
        assert any(h.value == "long/ape" for h in at.header)


def panels(at: AppTest) -> list[str]:
    """The compare page's panels, by their checkpoint's name (each panel's subheader-like markdown)."""
    [select] = [m for m in at.sidebar.multiselect if m.key == "compare_show"]
    return list(select.value)


def test_compare_shows_the_main_checkpoints_first_and_the_pick_goes_into_the_link(ckpts):
    at = run({"page": "compare"})
    assert panels(at) == ["ape", "none", "rpb", "sape2+ape"] and "show" not in at.query_params   # not long/ape
    [select] = [m for m in at.sidebar.multiselect if m.key == "compare_show"]
    assert "long/ape" in select.options
    select.set_value(["long/ape", "ape"]).run()
    assert not at.exception and panels(at) == ["long/ape", "ape"]
    assert at.query_params["show"] == "long/ape,ape"
    [link] = [c.value for c in at.sidebar.code]
    assert "show=long%2Fape,ape" in link
    table = at.dataframe[0].value
    assert list(table.index) == ["long/ape", "ape"]                     # the table follows the pick
    again = run({"page": "compare", "show": "long/ape,ape"})          # the link reopens the pick
    assert panels(again) == ["long/ape", "ape"] and not again.warning
    [select] = [m for m in at.sidebar.multiselect if m.key == "compare_show"]
    select.set_value([]).run()
    assert not at.exception and at.query_params["show"] == "-" and panels(at) == []
    assert any("No checkpoint picked" in i.value for i in at.info)
    at.switch_page("pages/bias.py").run()                              # other pages keep it in their link
    assert not at.exception and at.query_params["show"] == "-"


def test_a_link_naming_missing_checkpoints_keeps_the_others_with_a_note(ckpts):
    at = run({"page": "compare", "show": "rpb,long/rope_axial"})
    assert panels(at) == ["rpb"]
    [note] = [w.value.replace("\\", "") for w in at.warning if "show=" in w.value]    # Markdown-escaped
    assert note == "Ignored show='rpb,long/rope_axial': no checkpoint named 'long/rope_axial' here; using show='rpb'."
    assert at.query_params["show"] == "rpb"


def test_compare_loads_only_the_checkpoints_it_shows(folder, tmp_path, monkeypatch):
    """`long/odd` has a sound header but weights that do not fit its config: listing it (the
    pick's options, the controls' ranges) reads headers only, so it fails only once shown."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    root = tmp_path / "ckpts"
    shutil.copytree(folder, root)
    with safe_open(str(root / "ape.safetensors"), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    meta["config"] = json.dumps({**json.loads(meta["config"]), "encoding": "none"})   # ape's table: unexpected
    save_file(tensors, root / "long" / "odd.safetensors", metadata=meta)
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(root))
    at = run({"page": "compare"})
    [select] = [m for m in at.sidebar.multiselect if m.key == "compare_show"]
    assert "long/odd" in select.options and drawn(at) == ["ape", "none", "rpb", "sape2+ape"]
    assert not at.error
    select.set_value(["long/odd", "rpb"]).run()
    assert not at.exception and drawn(at) == ["rpb"] and panels(at) == ["long/odd", "rpb"]   # the pick is kept
    [error] = [e.value for e in at.error]
    assert "'long/odd' cannot be used" in error and "not 'history.<epoch>.<parameter of the none encoding>'" in error


def drawn(at: AppTest) -> list[str]:
    """The checkpoints whose panel the compare page drew (each panel's first line: **NAME** ...)."""
    return [m.value[2:].split("**")[0] for m in at.markdown if m.value.startswith("**") and " · " in m.value]


def test_a_name_outside_the_groups_is_refused(ckpts):
    at = run({"page": "checkpoints", "ckpt": "seeds/none-seed1"})
    assert any("ckpt" in w.value for w in at.warning) and at.session_state["ckpt"] != "seeds/none-seed1"


# ----------------------------------------------------------------------------- encoding scale
def test_the_checkpoints_page_charts_the_encoding_scale_by_layer_or_says_why_not(ckpts):
    at = run({"page": "checkpoints", "ckpt": "sape2+ape"})
    spec, _ = chart(at, "checkpoints_encoding_scale")
    assert [a["text"] for a in spec["layout"]["annotations"]] == ["bias std / logit std", "‖E_x‖", "‖E_y‖"]
    lines = {(t["name"], t["xaxis"]): t for t in spec["data"]}
    assert len(lines) == 6 and lines[("layer 0", "x")]["x"] == [2, 3]          # the missing first epoch left out
    assert any("content logits" in c.value for c in at.caption)
    for name, why in (("none", "adds no attention bias"), ("ape", "adds no attention bias"),
                      ("rpb", "trained before")):
        at = run({"page": "checkpoints", "ckpt": name})
        assert not [c for c in at.get("plotly_chart") if c.proto.id.endswith("checkpoints_encoding_scale")]
        assert any("No encoding-scale record" in c.value and why in c.value for c in at.caption), name


def test_the_bias_page_says_a_checkpoint_with_a_sound_header_and_bad_weights_cannot_be_used(folder, tmp_path,
                                                                                          monkeypatch):
    """The bias explorer reads a checkpoint's header first (its model only where the view needs
    it: not for a stored trace); weights that do not fit the header's config are said as the
    other pages say them, not a traceback."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    root = tmp_path / "ckpts"
    shutil.copytree(folder, root)
    with safe_open(str(root / "ape.safetensors"), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    meta["config"] = json.dumps({**json.loads(meta["config"]), "encoding": "none"})   # ape's table: unexpected
    save_file(tensors, root / "odd.safetensors", metadata=meta)
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(root))
    at = run({"page": "bias", "ckpt": "odd"})
    assert not at.exception, [e.value for e in at.exception]
    [error] = [e.value for e in at.error]
    assert "'odd' cannot be used" in error
