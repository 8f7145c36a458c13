"""Section 6 of BENCHMARKS.md (the ViT-B/16-sized model), from a run's `vit_b` results; its
prose is templates/vit_b.md. `python -m benchmarks.bench --only vit-b` rewrites this section
alone (`VIT_B_HEADING` finds it)."""
from __future__ import annotations

from typing import Any

from benchmarks.template import Template, jobs_text, load_text, md_table
from benchmarks.vit_b import VIT_B_SAPE2_LIMIT_S
from vitpe_core import membudget

T = Template("vit_b.md")
VIT_B_HEADING = "## 6. ViT-B/16 at real size"   # the start of the section's heading (templates/vit_b.md)
# The app's trace caches (pages/common/cache.py `_trace`, pages/common/stress_panel.py `_transformed`):
# pools of the process's one memory budget (`vitpe_core.membudget`, default DEFAULT_CACHE_MB MiB shared
# with every other cache), the bias page's at most 64 traces; tests/test_bench.py checks both values.
APP_TRACE_CACHE_ENTRIES = 64
APP_TRACE_CACHE_BYTES = membudget.DEFAULT_CACHE_MB * 2**20   # the standard library only: not the app
STEP_HEADERS = ["step", "n", "p50 ms", "p95 ms", "max ms", "CPU p50 ms"]
_MIB = 2 ** 20


def _mib(b: float) -> str:
    return f"{b / _MIB:.1f}"


def _steps_rows(steps: dict, label: str) -> list[list[Any]]:
    names = {"input": "`inputs.checkpoint_input` (crop, resize, normalise)", "trace": "`analysis.trace_image`",
             "stats": "`analysis.attention_stats`", "views": "first patch's views (bias page + compare panel)",
             "total": f"**{label}, total**"}
    return [[names[k], steps[k]["n"], f"{steps[k]['p50_ms']:.0f}", f"{steps[k]['p95_ms']:.0f}",
             f"{steps[k]['max_ms']:.0f}", f"{steps[k]['cpu_p50_ms']:.0f}" if "cpu_p50_ms" in steps[k] else "—"]
            for k in names if k in steps]


def _click_rows(clicks: dict, labels: tuple[tuple[str, str], ...], cpu: bool) -> list[list[Any]]:
    return [[what, clicks[k]["n"], f"{clicks[k]['p50_ms']:.1f}", f"{clicks[k]['p95_ms']:.1f}",
             f"{clicks[k]['max_ms']:.1f}", *([f"{clicks[k]['cpu_p50_ms']:.1f}"] if cpu else [])]
            for k, what in labels if k in clicks]


def md_vit_b(res: dict) -> list[str]:
    """Section 6's lines (none when the results have no `vit_b`)."""
    vb = res.get("vit_b")
    if not vb:
        return []
    env, ape, sape = vb["environment"], vb["ape"], vb.get("sape2+ape")
    cfg, grid, tb = vb["config"], ape["grid"], ape["trace_bytes"]
    others = ""
    if "others_cpu_share" in env:
        others = T.text("vit_b.others_share", share=100 * env["others_cpu_share"])
    out = T.lines("vit_b", dim=cfg["dim"], L=cfg["depth"], h=cfg["heads"], mlp_dim=cfg["mlp_dim"],
                  patch_size=cfg["patch_size"], img_h=cfg["img_size"][0], img_w=cfg["img_size"][1], grid_h=grid[0],
                  grid_w=grid[1], T=ape["tokens"], num_classes=cfg["num_classes"], params_m=ape["parameters"] / 1e6,
                  images=len(vb["images"]), command=env["command"], date=env["date"], mode=vb["mode"],
                  wall_s=vb["wall_time_s"], commit=env["git_commit"], cpu=env["cpu"],
                  cpu_id=env.get("cpu_id", "vendor not recorded"), cores=env["cores"],
                  usable_cores=env["usable_cores"], torch=env["torch"], threads=vb["threads"],
                  jobs_start=jobs_text(env["background_start"]), jobs_end=jobs_text(env["background_end"]),
                  load_start=load_text(env["loadavg_start"]), load_end=load_text(env["loadavg_end"]),
                  others_share=others)
    out += T.lines("vit_b.image", first_ms=ape["first_image_ms"]["total"])
    out += [md_table(STEP_HEADERS, _steps_rows(ape["image"], "new image")), ""]
    out += T.lines("vit_b.spread", fastest_ms=min(ape["image"]["total"]["samples_ms"]))
    out += T.lines("vit_b.clicks")
    labels = (("bias", "bias explorer (no bias for `ape`: attention row, prefix share)"),
              ("compare", "compare page, this model's panel and row"),
              ("cache_copy", "not in the targets: Streamlit's copy of the cached trace on every rerun "
                             f"(`pickle.loads` of {_mib(tb['pickled'])} MiB)"))
    out += [md_table(["click", "n", "p50 ms", "p95 ms", "max ms", "CPU p50 ms"],
                     _click_rows(ape["clicks"], labels, cpu=True)), ""]
    out += _trace_size(vb)
    out += _memory(vb.get("memory") or [], tb)
    return out + _sape(sape)


def _trace_size(vb: dict) -> list[str]:
    """What one trace weighs, what the app's trace caches would keep of it, and what to keep."""
    ape, sape = vb["ape"], vb.get("sape2+ape")
    tb, entries, cache_bytes = ape["trace_bytes"], APP_TRACE_CACHE_ENTRIES, APP_TRACE_CACHE_BYTES
    per = tb["pickled"]
    sape_size = sape_gib = sape_kept = ""
    if sape:
        sb = sape["trace_bytes"]
        sape_size = T.text("vit_b.trace.sape_size", total_mib=_mib(sb["total"]), pickled_mib=_mib(sb["pickled"]))
        sape_gib = T.text("vit_b.trace.sape_gib", gib=entries * sb["pickled"] / 2**30)
        sape_kept = T.text("vit_b.trace.sape_kept", kept=int(cache_bytes // sb["pickled"]))
    copy = ape["clicks"]["cache_copy"]
    out = T.lines("vit_b.trace", L=vb["config"]["depth"], h=vb["config"]["heads"], T=ape["tokens"],
                  attn_mib=_mib(tb["attn"]), pickled_mib=_mib(per), sape_size=sape_size, entries=entries,
                  cache_mib=_mib(cache_bytes), entries_gib=entries * per / 2**30, sape_gib=sape_gib,
                  kept=int(cache_bytes // per), sape_kept=sape_kept, copy_p50=copy["p50_ms"], copy_p95=copy["p95_ms"])
    return out + T.lines("vit_b.keep", weights_mib=_mib(4 * ape["parameters"]), entries=entries,
                         half_mib=_mib(per / 2))


def _memory(mem: list[dict], tb: dict) -> list[str]:
    """The memory probe's stages, and what the trace stage added."""
    if not mem:
        return []
    out = T.lines("vit_b.memory")
    out += [md_table(["stage", "VmRSS MiB", "VmHWM MiB"],
                     [[r["what"], f"{r['vmrss_mib']:.0f}", f"{r['vmhwm_mib']:.0f}"] for r in mem]), ""]
    by = {r["stage"]: r for r in mem}
    if "trace" in by and "model" in by:
        out += T.lines("vit_b.memory.summary", trace_rss=by["trace"]["vmrss_mib"], model_rss=by["model"]["vmrss_mib"],
                       imported_rss=by["imported"]["vmrss_mib"], trace_hwm=by["trace"]["vmhwm_mib"],
                       grow=by["trace"]["vmrss_mib"] - by["model"]["vmrss_mib"], arrays_mib=_mib(tb["total"]))
    return out


def _sape(sape: dict | None) -> list[str]:
    """`sape2+ape` at the same size: its new images and clicks, or why it stopped."""
    if sape is None:
        return []
    out = T.lines("vit_b.sape", limit_s=VIT_B_SAPE2_LIMIT_S)
    if sape.get("over_limit"):
        out += T.lines("vit_b.sape.over", max_s=sape["image"]["total"]["max_ms"] / 1e3, limit_s=VIT_B_SAPE2_LIMIT_S)
    out += [md_table(STEP_HEADERS, _steps_rows(sape["image"], "new image")), ""]
    if sape.get("clicks"):
        labels = (("bias", "bias explorer (SaPE² x + y bias row: `bias_view`)"),
                  ("compare", "compare page, this model's panel (bias row)"),
                  ("cache_copy", f"Streamlit's copy of the cached trace "
                                 f"({_mib(sape['trace_bytes']['pickled'])} MiB), not in the targets"))
        out += [md_table(["click (`sape2+ape`)", "n", "p50 ms", "p95 ms", "max ms"],
                         _click_rows(sape["clicks"], labels, cpu=False)), ""]
    return out
