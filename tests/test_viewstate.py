"""The app's view state: query strings parse to valid views, invalid values fall back with a
note, and a view survives the round trip through a real URL."""
from __future__ import annotations

import hashlib
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vitpe_core.viewstate import (KEYS, MAX_VALUE_CHARS, PAGES, STRESS_KEYS, StressLimits, ViewState, default_view,
                                  is_upload_id, parse_view, show_value, to_query, upload_id)

CKPTS = ["ape", "none", "rope_mixed", "rpb", "sape2+ape"]
IMAGES = ["cifar10-test-0000", "cifar10-test-0007", "photo-astronaut"]
DIMS = dict(grid=(8, 6), depth=3, heads=4, epochs=(0, 1, 2, 5))


def parse(params, checkpoints=CKPTS, **kw):
    return parse_view(params, checkpoints=checkpoints, images=IMAGES, **{**DIMS, **kw})


def test_empty_query_gives_defaults_without_notes():
    view, notes = parse({})
    assert notes == []
    assert view == ViewState(page="bias", ckpt="sape2+ape", image=IMAGES[0], patch=(4, 3), layer=0, head=None)
    assert default_view(checkpoints=["b", "a"], images=[]).ckpt == "b"      # no sape2+ape: the first
    assert default_view(checkpoints=[], images=[]) == ViewState(patch=(4, 4))


def test_valid_query_is_restored():
    view, notes = parse({"page": "similarity", "ckpt": "sape2+ape", "image": "photo-astronaut",
                         "patch": "7,5", "layer": "2", "head": "3"})
    assert notes == []
    assert view == ViewState("similarity", "sape2+ape", "photo-astronaut", (7, 5), 2, 3)
    assert parse({"head": "mean"})[0].head is None
    assert parse({"patch": " 1 , 2 "})[0].patch == (1, 2)


@pytest.mark.parametrize("view", [
    ViewState("bias", "sape2+ape", "cifar10-test-0007", (3, 4), 1, None),
    ViewState("compare", "rope_mixed", "photo-astronaut", (0, 5), 2, 0),
    ViewState("checkpoints", "ape", "cifar10-test-0000", (7, 0), 0, 3),
    ViewState("similarity", "ape", "cifar10-test-0000", (2, 1), 0, None, epoch=5),
    ViewState("similarity", "ape", "cifar10-test-0000", (2, 1), 0, None, epoch=0),
])
def test_round_trip_through_a_url(view):
    url = "http://localhost:8501/?" + urlencode(to_query(view))
    params = parse_qs(urlsplit(url).query, keep_blank_values=True)      # key -> list of values
    assert "sape2%2Bape" in url or view.ckpt != "sape2+ape"             # '+' must be escaped
    assert parse(params) == (view, [])


@pytest.mark.parametrize("key,value,words", [
    ("page", "admin", "not a page"),
    ("ckpt", "../../etc/passwd", "no checkpoint"),
    ("ckpt", "sape2 ape", "no checkpoint"),              # '+' decoded as a space by a careless client
    ("image", "nope", "not a gallery image"),
    ("image", "upload", "not a gallery image"),
    ("image", "upload:" + "a" * 63, "not an upload id"),                # one digit short
    ("image", "upload:" + "a" * 65, "not an upload id"),                # one too many
    ("image", "upload:" + "A" * 64, "not an upload id"),                # uppercase
    ("image", "upload:" + "g" * 64, "not an upload id"),                # not hex
    ("image", "upload:../../../etc/passwd", "not an upload id"),
    ("image", "upload:" + "a" * 60 + "/../", "not an upload id"),
    ("image", "upload:" + "a" * 64 + "\n", "not an upload id"),
    ("image", "upload: " + "a" * 64, "not an upload id"),
    ("image", "UPLOAD:" + "a" * 64, "not a gallery image"),
    ("image", "upload:" + "a" * 64 + ".png", "longer than"),
    ("patch", "99,99", "outside the 8x6"),
    ("patch", "8,0", "outside"),
    ("patch", "3", "row,col"),
    ("patch", "a,b", "row,col"),
    ("patch", "1,2,3", "row,col"),
    ("patch", "١,٢", "row,col"),                          # non-ASCII digits are not accepted
    ("layer", "-1", "valid layers are 0-2"),
    ("layer", "3", "valid layers are 0-2"),
    ("layer", "1.5", "not an integer"),
    ("layer", "", "not an integer"),
    ("head", "abc", "'mean' or an integer"),
    ("head", "4", "valid heads are 0-3"),
    ("head", "9" * 100, f"longer than {MAX_VALUE_CHARS}"),
    ("epoch", "3", "not a recorded epoch (recorded: 0-2, 5)"),
    ("epoch", "-1", "not a recorded epoch"),
    ("epoch", "last", "'final' or an integer"),
])
def test_invalid_values_fall_back_with_a_note(key, value, words):
    view, notes = parse({key: value})
    assert view == parse({})[0]
    assert len(notes) == 1 and words in notes[0] and key in notes[0], notes


def test_epoch_is_optional_in_links_and_checked_against_the_history():
    assert "epoch" not in to_query(parse({})[0])                        # the final weights: a clean link
    assert parse({"epoch": "final"}) == (parse({})[0], [])
    assert parse({"epoch": "2"})[0].epoch == 2
    view, notes = parse({"epoch": "2"}, epochs=())                      # a checkpoint without history
    assert view.epoch is None and "recorded no training history" in notes[0]
    assert parse({"epoch": "1"}, epochs=[True, "1", 1.0, -3, 1])[0].epoch == 1   # odd epoch lists are filtered
    assert "using epoch='final'" in parse({"epoch": "9"})[1][0]


def test_notes_do_not_echo_long_values():
    view, notes = parse({"ckpt": "x" * 60})
    assert len(notes) == 1 and "x" * 41 not in notes[0]


def test_lists_use_the_last_value_and_empty_lists_are_missing():
    assert parse({"layer": ["0", "2"]})[0].layer == 2
    assert parse({"layer": []}) == parse({})


def test_non_text_values_and_odd_mappings_never_raise():
    view, notes = parse({"layer": 2, "head": None, "patch": (1, 2), "ckpt": b"ape"})
    assert view == parse({})[0] and len(notes) == 3   # head=None counts as absent

    class Broken(dict):
        def __contains__(self, key):
            raise RuntimeError("boom")

    view, notes = parse(Broken())
    assert view == parse({})[0] and len(notes) == 1


def test_no_checkpoints_and_no_images():
    view, notes = parse_view({"ckpt": "ape", "image": "cifar10-test-0000"}, checkpoints=[], images=[],
                             grid=(8, 8), depth=1, heads=1)
    assert view.ckpt == "" and view.image == "" and len(notes) == 2
    assert "ckpt" not in to_query(view) and "image" not in to_query(view)


def _valid(view: ViewState, grid, depth, heads, epochs) -> bool:
    return (view.page in PAGES and view.ckpt in CKPTS and (view.image in IMAGES or is_upload_id(view.image))
            and 0 <= view.patch[0] < grid[0] and 0 <= view.patch[1] < grid[1]
            and 0 <= view.layer < depth and (view.head is None or 0 <= view.head < heads)
            and (view.epoch is None or view.epoch in epochs)
            and (view.show is None or all(n in CKPTS for n in view.show) and len(set(view.show)) == len(view.show)))


values = st.one_of(st.text(max_size=80), st.lists(st.text(max_size=20), max_size=3), st.integers(), st.none(),
                   st.sampled_from(["3,4", "0,0", "-1,2", "mean", "sape2+ape", "7", " 2", "1e3", "0x1", "final",
                                    "FINAL", "0", "5", "60", "-", "ape,rpb", "rpb,ape,rpb", "ape,long/ape",
                                    ",", "nope,other"]))


@settings(max_examples=300, deadline=None)
@given(params=st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=8)), values, max_size=8),
       grid=st.tuples(st.integers(1, 16), st.integers(1, 16)), depth=st.integers(1, 12), heads=st.integers(1, 8),
       epochs=st.lists(st.integers(0, 60), max_size=20))
def test_any_query_gives_a_valid_view(params, grid, depth, heads, epochs):
    dims = dict(grid=grid, depth=depth, heads=heads, epochs=epochs)
    view, notes = parse_view(params, checkpoints=CKPTS, images=IMAGES, **dims)
    assert _valid(view, grid, depth, heads, epochs)
    assert all(isinstance(n, str) and len(n) < 400 for n in notes)
    assert len(notes) <= len(KEYS)
    again, more = parse_view(to_query(view), checkpoints=CKPTS, images=IMAGES, **dims)
    assert (again, more) == (view, [])


def test_every_view_field_is_a_query_key():
    from dataclasses import fields
    full = ViewState(ckpt="a", image="b", epoch=0, shift=(1, 0), size=40, fill="reflect", rollout="CLS", fusion="max",
                     show=("a",), open=("rollout",), model="f" * 64)
    assert KEYS == tuple(f.name for f in fields(ViewState)) == tuple(to_query(full))


def test_open_sections_round_trip_and_odd_ones_are_refused():
    names = dict(checkpoints=["a"], images=["b"])
    for value, expected in (("stress", ("stress",)), ("stress,rollout", ("rollout", "stress")),
                            ("rollout,rollout", ("rollout",)), ("", ())):
        view, notes = parse_view({"open": value}, **names)
        assert view.open == expected and not notes, value
        assert parse_view(to_query(view), **names)[0] == view
    view, notes = parse_view({"open": "rollout,<script>"}, **names)       # the known one is kept, with a note
    assert view.open == ("rollout",) and notes == ["Ignored open='rollout,<script>': valid sections: rollout, "
                                                   "stress; using open='rollout'."]
    view, notes = parse_view({"open": "all"}, **names)
    assert view.open == () and "using open='none'" in notes[0]


def test_model_ids_round_trip_and_odd_ones_are_refused():
    sha = hashlib.sha256(b"weights").hexdigest()
    view, notes = parse({"model": sha})
    assert notes == [] and view.model == sha and to_query(view)["model"] == sha
    assert parse(to_query(view)) == (view, [])
    for bad in ("A" * 64, "a" * 63, "../" + "a" * 61):
        view, notes = parse({"model": bad})
        assert view.model == "" and len(notes) == 1 and "not a model id" in notes[0]


def test_upload_ids_round_trip():
    digest = hashlib.sha256(b"an image").hexdigest()
    image = upload_id(digest)
    assert image == "upload:" + digest and is_upload_id(image)
    view, notes = parse({"image": image, "patch": "2,3", "layer": "1", "head": "0"})
    assert notes == [] and view.image == image and (view.patch, view.layer, view.head) == ((2, 3), 1, 0)
    assert to_query(view)["image"] == image
    assert parse(to_query(view)) == (view, [])
    for bad in ("", "A" * 64, "a" * 63, "a" * 65, "../" + "a" * 61, "a" * 64 + "\n"):
        assert not is_upload_id("upload:" + bad)
        with pytest.raises(ValueError):
            upload_id(bad)
    assert not is_upload_id(None) and not is_upload_id(digest) and not is_upload_id(b"upload:" + digest.encode())


# ----------------------------------------------------------------------------- the stress test and rollout in links
STRESS = StressLimits(shifts=tuple(range(-8, 9)), heights=(24, 28, 32, 36, 40, 44, 48), native=32,
                      sources=("patch", "CLS"))   # the 32-px CIFAR models with 4-px patches


def test_stress_and_rollout_round_trip_and_stay_out_of_default_links():
    view, notes = parse({"shift": "4,-2", "size": "40", "fill": "reflect", "rollout": "CLS", "fusion": "max"},
                        stress=STRESS)
    assert notes == []
    assert (view.shift, view.size, view.fill, view.rollout, view.fusion) == ((4, -2), 40, "reflect", "CLS", "max")
    q = to_query(view)
    assert (q["shift"], q["size"], q["fill"], q["rollout"], q["fusion"]) == ("4,-2", "40", "reflect", "CLS", "max")
    assert parse(q, stress=STRESS) == (view, [])
    plain, notes = parse({"shift": "0,0", "size": "32", "fill": "zero", "rollout": "patch", "fusion": "mean"},
                         stress=STRESS)
    assert notes == [] and plain == parse({})[0]                              # native size is the default
    assert not set(to_query(plain)) & set(STRESS_KEYS)                           # old links are unchanged
    assert parse({"size": "native"}, stress=STRESS) == (plain, [])


@pytest.mark.parametrize("key,value,why", [
    ("shift", "9,0", "not a shift this model offers (-8 to 8 px in steps of 1 px)"),
    ("shift", "1", "expected 'dy,dx'"), ("shift", "1,x", "expected 'dy,dx'"), ("shift", "1,2,3", "expected 'dy,dx'"),
    ("shift", "99999999,0", "expected 'dy,dx'"),
    ("size", "33", "not an input size this model offers"), ("size", "4000", "not an input size"),
    ("size", "big", "expected 'native' or an input height"),
    ("fill", "wrap", "valid: zero, reflect"), ("rollout", "dist", "valid: patch, CLS"),
    ("rollout", "<script>", "valid: patch, CLS"), ("fusion", "min", "valid: mean, max"),
])
def test_tampered_stress_values_are_refused_with_a_note(key, value, why):
    view, notes = parse({key: value, "patch": "2,3"}, stress=STRESS)
    assert len(notes) == 1 and notes[0].startswith(f"Ignored {key}=") and why in notes[0], notes
    assert view == parse({"patch": "2,3"})[0]                                    # the default, the rest kept


def test_without_the_models_options_only_the_default_stress_view_is_valid():
    view, notes = parse({"shift": "4,0", "size": "40", "fill": "reflect", "rollout": "CLS"})
    assert view == parse({"fill": "reflect"})[0]
    assert [n.split("=")[0] for n in notes] == ["Ignored shift", "Ignored size", "Ignored rollout"]
    assert "this model offers no shift" in notes[0]
    assert parse({"fill": "reflect", "fusion": "max"})[1] == []                   # the same choices for every model


def test_stress_fills_are_defined_once():
    from vitpe_core import stress
    from vitpe_core.viewstate import FILLS
    assert stress.FILLS is FILLS


# ----------------------------------------------------------------------------- the compare page's checkpoints
def test_shown_checkpoints_round_trip_in_their_order_and_stay_out_of_default_links():
    view, notes = parse({"page": "compare", "show": "sape2+ape,ape,none"})
    assert notes == [] and view.show == ("sape2+ape", "ape", "none")
    assert to_query(view)["show"] == "sape2+ape,ape,none" and parse(to_query(view)) == (view, [])
    assert "show" not in to_query(parse({})[0])                                      # default: left out
    empty, notes = parse({"show": "-"})
    assert notes == [] and empty.show == () and to_query(empty)["show"] == "-" and parse(to_query(empty))[0] == empty
    assert parse({"show": " ape , rpb,ape "}) == (parse({"show": "ape,rpb"})[0], [])   # spaces, repeats dropped
    url = "http://host/?" + urlencode(to_query(parse({"show": "sape2+ape,rpb"})[0]))     # '+' survives a real URL
    assert parse({k: v for k, v in parse_qs(urlsplit(url).query).items()})[0].show == ("sape2+ape", "rpb")


def test_a_comma_or_percent_sign_in_a_checkpoint_name_survives_a_link():
    names = ["a,b", "50%", "a%2Cb", "ape"]                  # files may be named so; `a%2Cb` literally
    view, notes = parse({"show": show_value(names)}, checkpoints=[*CKPTS, *names])
    assert notes == [] and view.show == tuple(names)
    assert to_query(view)["show"] == "a%2Cb,50%25,a%252Cb,ape"
    url = "http://host/?" + urlencode(to_query(view))                                  # through a real URL
    params = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
    assert parse(params, checkpoints=[*CKPTS, *names]) == (view, [])
    assert parse({"show": "a,b"}, checkpoints=[*CKPTS, "a,b"])[0].show is None        # unescaped: two names
    assert parse({"show": "ape,50%"}, checkpoints=[*CKPTS, "50%"])[0].show == ("ape", "50%")   # a lone % is kept


def test_a_checkpoint_named_dash_is_not_confused_with_none():
    view, notes = parse({"show": show_value(["-"])}, checkpoints=[*CKPTS, "-"])
    assert notes == [] and view.show == ("-",) and to_query(view)["show"] == "%2D"
    assert parse({"show": "-"}, checkpoints=[*CKPTS, "-"])[0].show == ()              # `-` alone: none
    assert parse({"show": show_value(["-", "ape"])}, checkpoints=[*CKPTS, "-"])[0].show == ("-", "ape")


@given(st.lists(st.text(alphabet=",%2C5cDd- a", min_size=1, max_size=6).filter(lambda n: n == n.strip()),
                min_size=1, max_size=4, unique=True))
@settings(max_examples=200, deadline=None)
def test_show_value_round_trips_any_names(names):
    view, notes = parse({"show": show_value(names)}, checkpoints=names)
    assert notes == [] and view.show == tuple(names)


def test_unknown_shown_checkpoints_are_dropped_with_a_note_and_the_rest_kept():
    view, notes = parse({"show": "ape,long/ape,rpb"})
    assert view.show == ("ape", "rpb")
    assert len(notes) == 1 and notes[0].startswith("Ignored show='ape,long/ape,rpb': no checkpoint named 'long/ape'")
    assert notes[0].endswith("using show='ape,rpb'.")
    view, notes = parse({"show": "x,y,z,w"})
    assert view.show is None and "no checkpoints named 'x', 'y', 'z' and more here" in notes[0]
    assert "using show=\"the page's default\"" in notes[0]
    view, notes = parse({"show": ","})
    assert view.show is None and "expected checkpoint names separated by commas" in notes[0]
    assert parse({"show": "ape," * 300})[1][0].startswith("Ignored show='ape,ape,")   # over MAX_SHOW_CHARS
    assert "longer than 1024 characters" in parse({"show": "ape," * 300})[1][0]
