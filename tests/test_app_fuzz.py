"""Random query strings through the real app (AppTest via app.py): it never raises, and every
invalid value is reported, never acted upon (reliability issue: links)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_app import APP, PAGES, run

KEYS = ["page", "ckpt", "image", "patch", "layer", "head", "show"]
NASTY = ["", " ", "..", "../../etc/passwd", "/etc/passwd", "%00", "\x00", "sape2+ape", "ape", "none", "3,4",
         "-1,2", "99999999999999999999", "1e9", "nan", "inf", "0x10", "1,2,3", ",", "mean", "🙂", "<script>",
         "a" * 5000, "ape,none", "-",
         "ape,,long/ape,ape", "cifar10-test-0000", "photo-astronaut", "bias", "compare", "similarity", "checkpoints"]
values = st.one_of(st.sampled_from(NASTY), st.text(max_size=40))


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(params=st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=6)), values, max_size=7))
def test_random_query_strings_never_raise(app_checkpoint_dir, params):
    with pytest.MonkeyPatch.context() as mp:   # a function-scoped monkeypatch cannot wrap @given
        mp.setenv("VITPE_CHECKPOINTS", str(app_checkpoint_dir))
        at = run(params)
    assert not at.exception, (params, [e.value for e in at.exception])
    assert at.title and at.title[0].value                    # a page rendered
    # what the app keeps in the URL afterwards is always a valid, canonical view
    assert set(at.query_params) <= set(KEYS)
    if "patch" in at.query_params:
        r, c = (int(v) for v in at.query_params["patch"].split(","))
        assert 0 <= r < 8 and 0 <= c < 8
    if "ckpt" in at.query_params:
        assert at.query_params["ckpt"] in {"ape", "sape2+ape", "rope_mixed", "rpb", "none"}
    if "show" in at.query_params and at.query_params["show"] != "-":
        assert set(at.query_params["show"].split(",")) <= {"ape", "sape2+ape", "rope_mixed", "rpb", "none"}


def test_the_app_routes_every_page_script_and_the_fuzzer_draws_each(app_checkpoint_dir, monkeypatch):
    """Refusing an unknown page, the app names the pages it routes: exactly the scripts in
    pages/, and the fuzzer draws every one (a page left out would go unreachable or unfuzzed)."""
    monkeypatch.setenv("VITPE_CHECKPOINTS", str(app_checkpoint_dir))
    at = run({"page": "no-such-page"})
    [refusal] = [w.value for w in at.warning if "Ignored page=" in w.value]
    routed = sorted(re.search(r"valid\\?: ([^)]*)\)", refusal).group(1).split(", "))
    scripts = sorted(p.stem for p in (Path(APP).parent / "pages").glob("*.py"))
    assert routed == scripts == sorted(PAGES)
    assert set(routed) <= set(NASTY)
