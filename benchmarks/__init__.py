"""Benchmarks and load tests of vitpe (not part of the library, not installed with it).

* `python -m benchmarks.bench` -> BENCHMARKS.md / benchmarks.json: bench.py runs one module per
  section (attention, training, clicks, app, memory, vit_b, layer_profile, analysis_budget; the
  method in timing.py), judges the targets (targets.py) and renders the report (report.py,
  report_vit_b.py, templates/); probes/ holds the child programs it runs in subprocesses;
* `python -m benchmarks.load_test`: concurrent sessions against the app (load_ws.py,
  load_browser.py, load_plan.py, load_probes.py; Streamlit's protocol in st_client.py);
* `click_cost`, `warmup_ab`, `memory_walk`: single measurements for RELIABILITY.md;
* `benchmarks.harness`: the server, browser and machine helpers they and the browser tests share.
"""
