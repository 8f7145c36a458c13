"""The demo on several replicas behind nginx (issue 47): `python -m benchmarks.replicas --short`,
2 replicas on one shared folder, 10 websocket sessions through nginx for 15 s with a small import,
a share link (an imported model, an uploaded image) made on one replica opened on the other and
through nginx, and again after both restarted. Needs nginx (`.ci/run` installs it)."""
from __future__ import annotations

import json

import pytest

from benchmarks import replicas

pytestmark = pytest.mark.slow


def test_the_compose_files_nginx_conf_is_the_template_filled():
    assert replicas.COMPOSE_CONF.read_text(encoding="utf-8") == replicas.compose_conf(), \
        "deploy/replicas/nginx.compose.conf is stale: python -m benchmarks.replicas --write-compose-conf"


def test_the_nginx_conf_passes_websockets_uploads_and_keeps_a_visitor_on_one_replica(tmp_path):
    conf = replicas.nginx_conf(8080, [8601, 8602], tmp_path)
    assert "hash $cookie__streamlit_xsrf consistent" in conf and "proxy_set_header Upgrade $http_upgrade" in conf
    assert f"client_max_body_size {replicas.max_upload_mb()}m" in conf
    assert "server 127.0.0.1:8601" in conf and "server 127.0.0.1:8602" in conf and "{{" not in conf


@pytest.mark.skipif(replicas.nginx_binary() is None, reason="nginx is not installed (apt-get install nginx; "
                                                           ".ci/run installs it)")
def test_two_replicas_behind_nginx_share_links_across_each_other_and_a_restart(tmp_path):
    out = tmp_path / "replicas.json"
    assert replicas.main(["--short", "--no-single", "--out", str(out)]) == 0, json.loads(out.read_text())["failures"]
    report = json.loads(out.read_text())
    assert all(n > 0 for n in report["sessions_per_replica"].values())        # both replicas served sessions
    load = report["load"]
    assert load["clicks"] > 0 and not load["errors"] and not load["crosstalk"] and not report["errors"]
    assert "model=" in report["link"] and "image=upload" in report["link"]
