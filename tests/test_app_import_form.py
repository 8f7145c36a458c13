"""The Checkpoints page's import form with the families of issue 27 (AppTest through app.py): a
Swin's weights with the config.json saved beside them (a Swin's windows and depths are not in
its keys), a timm CLIP file with the activation chosen in the form, a Hugging Face hub id (from a
hub cache the test lays out, offline; and with no network, the files to fetch instead), and
what a wrong config.json or hub id gets. Each imported model then draws on the bias explorer."""
from __future__ import annotations

import re

import pytest

from test_app import ok, run, served_routing  # noqa: F401 — a fixture (page switches through app.py)

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (requirements-dev.txt)")


@pytest.fixture(autouse=True)
def _empty_folder_and_own_uploads(tmp_path, monkeypatch):
    """No folder checkpoints (the imported model is the only one), the test's own upload store and
    an empty memory budget: the store of imported models lives as long as the process, and an
    earlier test module of this worker may have imported the same bytes under another name."""
    from vitpe_core import membudget
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(tmp_path / "empty"))
    monkeypatch.setenv("VITPE_UPLOAD_DIR", str(tmp_path / "uploads"))
    membudget.shared().clear()


def _form(at, *, weights=None, config=None, hub=None, act=None):
    """Fill the Checkpoints page's import form and press Import (as a visitor does)."""
    if weights is not None:
        at.file_uploader(key="checkpoints_model_upload").set_value((weights[0], weights[1], "application/octet-stream"))
    if config is not None:
        at.file_uploader(key="checkpoints_model_config").set_value((config[0], config[1], "application/json"))
    if hub is not None:
        at.text_input(key="checkpoints_model_hub").set_value(hub)
    if act is not None:
        at.selectbox(key="checkpoints_model_act").set_value(act)
    ok(at.run())
    at.button(key="checkpoints_model_import").click()
    return ok(at.run())


def _imported_name(at) -> str:
    [done] = [s.value for s in at.success if s.value.startswith("Imported as")]
    return done.split("`")[1]


@pytest.fixture(scope="module")
def swin_folder(tmp_path_factory):
    from test_swin import hf_model
    folder = tmp_path_factory.mktemp("swin_src")
    hf_model(2, image_size=40, window_size=3).save_pretrained(folder)
    return folder


def test_a_swin_with_its_config_imports_and_draws_its_windows(swin_folder):
    weights = ("model.safetensors", (swin_folder / "model.safetensors").read_bytes())
    at = _form(ok(run({"page": "checkpoints"})), weights=weights,
               config=("config.json", (swin_folder / "config.json").read_bytes()))
    assert not at.error, [e.value for e in at.error]
    name = _imported_name(at)
    at.switch_page("pages/bias.py")
    at = ok(at.run())
    at = ok(at.selectbox(key="bias_ckpt").set_value(name).run())               # the visitor picks it
    at = ok(at.select_slider(key="bias_layer").set_value(1).run())
    assert not at.error, [e.value for e in at.error]
    captions = " ".join(c.value for c in at.caption)
    assert "attends only inside its window" in captions and "block 1 (stage 0, block 1), shifted" in captions, captions
    other = ok(run({"page": "bias", "ckpt": name}))          # another session does not list this one's import
    assert any(name in w.value for w in other.warning), [w.value for w in other.warning]


def test_an_imported_swin_stays_the_sessions_model_across_every_page(swin_folder, tmp_path, monkeypatch):
    """Issue 44, item 3: an imported model without a position table (Swin-V2 here) stays the
    session's checkpoint, with `model=` in the address bar, through the similarity page (which
    shows the folder's `ape` instead), Compare and Checkpoints, back to the Bias explorer."""
    from benchmarks.harness import write_random_checkpoints

    monkeypatch.setenv("VITPE_CHECKPOINTS", str(write_random_checkpoints(tmp_path / "ckpts", ["ape"])))
    weights = ("model.safetensors", (swin_folder / "model.safetensors").read_bytes())
    at = _form(ok(run({"page": "checkpoints"})), weights=weights,
               config=("config.json", (swin_folder / "config.json").read_bytes()))
    name = _imported_name(at)
    at.switch_page("pages/bias.py")
    at = ok(ok(at.run()).selectbox(key="bias_ckpt").set_value(name).run())
    model = at.query_params["model"]
    assert model
    for page in ("similarity", "bias", "compare", "checkpoints", "bias"):
        at.switch_page(f"pages/{page}.py")
        at = ok(at.run())
        assert not at.error, (page, [e.value for e in at.error])
        assert at.session_state["ckpt"] == name and at.query_params["model"] == model, page


def test_save_pretrained_folders_are_named_by_their_model_type_not_model_upload(swin_folder, tmp_path):
    """Issue 44, item 5: two `save_pretrained` folders (BEiT, Swin-V2: each `model.safetensors` +
    `config.json`) became `model-upload` and `model-upload_` (and the report
    `model-upload_report.html`). Their names now say the config's model type; a second BEiT folder
    in the session gets a name of its own; a file named for its model keeps its stem."""
    from test_app import _small_vit, _timm_npz
    from test_importers_families import build, save

    from pages.common.model_import import upload_name

    def files(folder):
        return {"weights": ("model.safetensors", (folder / "model.safetensors").read_bytes()),
                "config": ("config.json", (folder / "config.json").read_bytes())}

    beit = save(build("beit_layer_bias_mean"), tmp_path / "beit").parent
    other_beit = save(build("beit_layer_bias_mean", num_labels=3), tmp_path / "beit2").parent
    at, names = ok(run({"page": "checkpoints"})), []
    for folder in (beit, swin_folder, other_beit):
        at = _form(at, **files(folder))
        assert not at.error, [e.value for e in at.error]
        names.append(_imported_name(at))
    assert names == ["beit-model-upload", "swinv2-model-upload", "beit-model-upload_"], names
    assert at.session_state["ckpt"] == "beit-model-upload_"
    at = _form(ok(run({"page": "checkpoints"})), weights=("my_vit.npz", _timm_npz(_small_vit())))
    assert _imported_name(at) == "my_vit-upload"
    # Where the config names its origin (transformers 4 wrote `_name_or_path`), that says it:
    assert upload_name("model.safetensors", {"model_type": "swinv2", "_name_or_path":
                                             "microsoft/swinv2-tiny-patch4-window8-256"}, "swin") == \
        "swinv2-tiny-patch4-window8-256-upload"
    assert upload_name("pytorch_model.bin", {"model_type": "beit", "_name_or_path": "/home/me/ft-flowers/"},
                       "beit") == "beit-ft-flowers-upload"
    assert upload_name("model.safetensors", {"architecture": "vit_small_patch16_224.augreg_in21k"},
                       "timm") == "vit_small_patch16_224-model-upload"
    assert upload_name("open_clip_pytorch_model.bin", None, "timm") == "timm-open_clip_pytorch_model-upload"
    for odd in ("../../x y?&#%.npz", "модель.npz", "-rf.npz", ".hidden.npz"):     # safe in file names and URLs
        name = upload_name(odd, {"model_type": "a/b c"}, "timm")
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*-upload", name), (odd, name)


def test_an_import_with_a_smaller_grid_warns_of_no_patch_the_visitor_never_typed(tmp_path, monkeypatch):
    """Issue 44, item 11c: right after an import the page warned "Ignored patch='4,4': outside the
    4x4 patch grid": the session's patch (the 8x8 folder model's centre) was checked against the
    new model's grid as if a link had carried it. A value the session carried quietly falls back
    (patch and layer here); a link's is still reported."""
    from test_app import _small_vit, _timm_npz

    from benchmarks.harness import write_random_checkpoints
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(write_random_checkpoints(tmp_path / "ckpts", ["ape"])))
    at = ok(run({"page": "bias"}))
    at = ok(at.select_slider(key="bias_layer").set_value(1).run())          # the 2-layer folder model's last layer
    assert at.session_state["patch"] == (4, 4) and at.session_state["layer"] == 1
    at.switch_page("pages/checkpoints.py")
    at = _form(ok(at.run()), weights=("small.npz", _timm_npz(_small_vit(img_size=16))))   # 4x4 grid, one layer
    assert _imported_name(at) == "small-upload" and at.session_state["ckpt"] == "small-upload"
    assert not [w.value for w in at.warning if "Ignored" in w.value], [w.value for w in at.warning]
    assert at.session_state["patch"] == (2, 2) and at.session_state["layer"] == 0     # the new model's defaults
    at.switch_page("pages/bias.py")
    at = ok(at.run())
    assert not [w.value for w in at.warning if "Ignored" in w.value], [w.value for w in at.warning]
    link = ok(run({"page": "bias", "ckpt": "ape", "patch": "9,9", "layer": "5"}))   # a link's values: reported
    warned = " ".join(w.value for w in link.warning)
    assert "Ignored patch='9,9'" in warned and "Ignored layer='5'" in warned, warned


def test_a_swin_without_its_config_is_refused_naming_the_file_to_add(swin_folder):
    weights = ("model.safetensors", (swin_folder / "model.safetensors").read_bytes())
    at = _form(ok(run({"page": "checkpoints"})), weights=weights)
    [error] = [e.value for e in at.error]
    assert error.startswith("model.safetensors was not imported") and "config.json" in error, error


@pytest.mark.parametrize("config, said", [(b"{not json", "is not JSON"), (b"[1, 2]", "not an object"),
                                          (b"\xff\xfe", "is not JSON")])
def test_a_config_that_is_not_a_config_gets_a_plain_message(swin_folder, config, said):
    weights = ("model.safetensors", (swin_folder / "model.safetensors").read_bytes())
    at = _form(ok(run({"page": "checkpoints"})), weights=weights, config=("config.json", config))
    [error] = [e.value for e in at.error]
    assert said in error and "config.json" in error, error


def test_a_hub_id_imports_from_the_hub_cache_and_without_a_network_names_the_files(tmp_path,
                                                                                     monkeypatch):
    import huggingface_hub.constants as hub
    from test_importers_families import _hub_cache, build, save
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)          # read at call time; the env var only at import
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    src = save(build("beit_layer_bias_mean"), tmp_path / "beit")
    _hub_cache(tmp_path / "hub", "someone/tiny-beit", src.parent)

    at = _form(ok(run({"page": "checkpoints"})), hub="someone/tiny-beit")
    assert not at.error, [e.value for e in at.error]
    name = _imported_name(at)
    assert name.startswith("someone__tiny-beit")

    at = _form(ok(run({"page": "checkpoints"})), hub="nobody/not-cached")
    [error] = [e.value for e in at.error]
    assert "model.safetensors" in error and "config.json" in error and "huggingface.co/nobody/not-cached" in error

    at = _form(ok(run({"page": "checkpoints"})), hub="../../etc/passwd")
    [error] = [e.value for e in at.error]
    assert "is not a Hugging Face hub id" in error


def test_a_bare_timm_clip_file_takes_the_activation_from_the_form():
    """A timm CLIP-style file (pre-norm) without its config: refused with the option to set; with
    quick_gelu chosen in the form, imported."""
    from safetensors.torch import save as st_save

    ref = _timm_case("clip_quickgelu")
    data = st_save({k: v.contiguous() for k, v in ref.items()})
    at = _form(ok(run({"page": "checkpoints"})), weights=("clip.safetensors", data))
    [error] = [e.value for e in at.error]
    assert "--act" in error or "activation" in error.lower(), error
    at = _form(ok(run({"page": "checkpoints"})), weights=("clip.safetensors", data), act="quick_gelu")
    assert not at.error, [e.value for e in at.error]


def _timm_case(case: str) -> dict:
    """A timm-layout state dict from the committed reference vectors (tests/data, written by
    scripts/make_import_references.py with timm itself)."""
    from test_importers_timm_families import CASES
    return {k.removeprefix("sd."): v for k, v in CASES[case].items() if k.startswith("sd.")}


def _spy_on_the_build(monkeypatch, name: str, fail: bool = False) -> list[int]:
    """`importers.import_file` wrapped: what it appends, when the model is about to be built, is how
    many `UploadedFile`s of `name` still hold its bytes, and whether Streamlit's upload manager
    does; with `fail` the import then fails as a file the importer refuses does."""
    import gc

    import vitpe_core.importers as importers
    from streamlit.runtime.uploaded_file_manager import UploadedFile
    from vitpe_core.checkpoint import CheckpointError

    from pages.common import import_form
    seen, real = [], importers.import_file

    def spy(path, **kw):
        mgr, session = import_form._upload_manager()
        seen.append(sum(type(o) is UploadedFile and o.name == name and not o.closed for o in gc.get_objects()))
        seen.append(any(r.name == name for r in mgr.file_storage.get(session, {}).values()))
        if fail:
            raise CheckpointError(f"{name}: refused")
        return real(path, **kw)

    monkeypatch.setattr(importers, "import_file", spy)
    return seen


def test_the_uploaded_bytes_are_let_go_before_the_model_is_built_and_put_back_when_it_fails(monkeypatch):
    """Issue 30: the upload's bytes (a ViT-B/16 in float16: 173 MB, in Streamlit's upload manager
    and in the uploader's session state, this run's value and the last run's) and its float32
    model were held at once, the server's peak. They go before the build; an import that fails
    puts the file back in the upload manager, for another try."""
    from pages.common import import_form
    from test_app import _small_vit, _timm_npz

    data = _timm_npz(_small_vit())
    seen = _spy_on_the_build(monkeypatch, "held.npz")
    at = _form(ok(run({"page": "checkpoints"})), weights=("held.npz", data))
    assert not at.error and _imported_name(at) == "held-upload"
    assert seen == [0, False], seen

    data = _timm_npz(_small_vit(4))                       # another file: the first is in the store already
    seen, back = _spy_on_the_build(monkeypatch, "refused.npz", fail=True), []
    restore = import_form._restore_upload

    def spy_restore(page, up, copy):
        restore(page, up, copy)
        mgr, session = import_form._upload_manager()
        back.extend(r.data == data for r in mgr.get_files(session, [up.file_id]))

    monkeypatch.setattr(import_form, "_restore_upload", spy_restore)
    at = _form(ok(run({"page": "checkpoints"})), weights=("refused.npz", data))
    [error] = [e.value for e in at.error]
    assert error == "refused.npz was not imported: refused.npz: refused", error
    assert seen == [0, False] and back == [True], (seen, back)
    # The uploader's value is gone from this session (its bytes were let go) while the browser
    # still shows the file: the form offers Import again for the file kept in the upload manager
    # (the button was missing until the visitor's next change).
    assert any("`refused.npz` is still selected" in c.value for c in at.caption), [c.value for c in at.caption]
    assert at.button(key="checkpoints_model_import")    # (pressing it again: tests/test_browser.py, a real server)


def test_a_copy_of_an_uploaded_file_shares_its_bytes_and_is_still_a_file_of_its_own():
    """Streamlit deep-copies a widget's value on every run that draws it: a weights file in the
    uploader was copied whole on each rerun (173 MB for a ViT-B/16 in float16, issue 30)."""
    import copy

    from streamlit.proto.Common_pb2 import FileURLs
    from streamlit.runtime.uploaded_file_manager import UploadedFile, UploadedFileRec

    from pages.common import import_form
    import_form.share_uploads_on_copy()
    data = bytes(range(256)) * 4
    up = UploadedFile(UploadedFileRec("id", "vit.npz", "application/octet-stream", data), FileURLs())
    up.seek(10)
    twin = copy.deepcopy(up)
    assert twin.getvalue() is data and (twin.name, twin.file_id, twin.size, twin.tell()) == ("vit.npz", "id", 1024, 10)
    twin.write(b"changed")
    assert up.getvalue() is data and twin.getvalue()[10:17] == b"changed" and up.tell() == 10


@pytest.mark.usefixtures("served_routing")
def test_a_model_evicted_while_its_page_is_drawn_gets_a_message_not_a_traceback(monkeypatch):
    """Issue 30's load test with imports: another visitor's import evicted a session's model while
    that session's bias page was half drawn; the page's next lookup by name raised
    "no checkpoint named 'loadb16-s6-upload'" as a traceback. The router now says what happened."""
    from test_app import _small_vit, _timm_npz

    from pages.common import cache, imported
    at = _form(ok(run({"page": "checkpoints"})), weights=("vit.npz", _timm_npz(_small_vit())))
    name = _imported_name(at)
    real_trace = cache.trace

    def trace_then_evict(*args, **kwargs):      # the page has its checkpoint; then the stores lose it
        import shutil
        out = real_trace(*args, **kwargs)
        imported.model_store().budget.clear()
        shutil.rmtree(imported.disk_models().folder)   # from memory and from disk (issue 47's store)
        return out

    monkeypatch.setattr(cache, "trace", trace_then_evict)
    at.switch_page("pages/bias.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(f"The imported model {name!r} was removed from the server" in w.value for w in at.warning), \
        [w.value for w in at.warning]


def test_an_imported_models_link_opens_after_the_process_forgot_it_and_not_after_the_store_did():
    """Issue 47: an import is kept on disk under its sha256 (`VITPE_MODEL_DIR`, default under the
    upload folder), so a link's `model=` opens it in another session after the memory budget
    evicted it or the server restarted (the memory emptied here); with the disk store gone too,
    the link's page says so."""
    import shutil

    from test_app import _small_vit, _timm_npz

    from pages.common import imported
    from vitpe_core import membudget
    at = _form(ok(run({"page": "checkpoints"})), weights=("vit.npz", _timm_npz(_small_vit())))
    name = _imported_name(at)
    at.switch_page("pages/bias.py")
    at = ok(ok(at.run()).selectbox(key="bias_ckpt").set_value(name).run())
    link = {"page": "bias", **{k: at.query_params[k] for k in ("ckpt", "model", "patch")}}
    assert imported.disk_models().size()[0] == 1
    membudget.shared().clear()                                   # a restart: nothing in memory
    other = ok(run(link))
    assert other.session_state["ckpt"] == name and not other.warning, [w.value for w in other.warning]
    assert other.query_params["model"] == link["model"]
    membudget.shared().clear()
    shutil.rmtree(imported.disk_models().folder)                    # and the store on disk gone too
    gone = ok(run(link))
    assert any("is not on this server any more" in w.value for w in gone.warning), [w.value for w in gone.warning]


def test_a_run_on_a_big_imported_model_takes_the_servers_one_turn_and_gives_it_back(monkeypatch):
    """Issue 47: a run using a big imported model keeps it in memory after the budget evicted it, so
    several runs on several such models held them all at once (a replica at 1.2 GiB). Such a run takes
    the server's one turn (`imported.model_turns`) before it loads the model and gives it back when it ends;
    a run that finds the turn held waits (here: past a short limit, and goes on without one)."""
    from test_app import _small_vit, _timm_npz
    from test_turns import another_run_holding_the_turn

    from pages.common import imported
    monkeypatch.setattr(imported, "BIG_MODEL_MB", 0)             # the test's small import counts as big
    turns = imported.model_turns()
    at = _form(ok(run({"page": "checkpoints"})), weights=("vit.npz", _timm_npz(_small_vit())))
    name = _imported_name(at)
    at.switch_page("pages/bias.py")      # AppTest runs the page file alone here: no app.py, no turns
    at = ok(ok(at.run()).selectbox(key="bias_ckpt").set_value(name).run())
    link = {"page": "bias", **{k: at.query_params[k] for k in ("ckpt", "model", "patch")}}
    taken = turns.taken
    at = ok(run(link))                   # a visitor opening the link: app.py's run, the model drawn
    assert at.session_state["ckpt"] == name
    assert turns.taken == taken + 1 and turns.waited == 0 and turns.timeouts == 0
    with turns.scope():                                          # given back at the run's end: free now
        assert turns.take() and turns.waited == 0

    with another_run_holding_the_turn(turns):
        monkeypatch.setattr(turns, "wait_s", 0.5)
        at = ok(run(link))                   # another visitor on the link (AppTest's reruns skip app.py)
        assert turns.waited == 1 and turns.timeouts == 1      # it waited, then drew the page anyway
        assert at.session_state["ckpt"] == name
        from pages.common import status                     # the sidebar's "Server status" says so
        text = status.turns_text(turns)
        assert "1 waited for" in text and "1 went on after 0 s without one" in text, text
