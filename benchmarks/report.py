"""BENCHMARKS.md from a run's results: `render_markdown` lays the sections out in the report's
order (header, machine, targets, 1-5, 6 from `benchmarks.report_vit_b`, 7-9); the prose is
templates/report.md, the tables are built here. Missed targets get a **Why** line whose text the
maintainers write by hand and a rerun keeps (`written_whys`)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.analysis_budget import ANALYSIS_LIMIT_S
from benchmarks.attention import BATCHES, FUNCTIONAL_BASE, FUNCTIONAL_BATCH, WIDTHS
from benchmarks.layer_profile import PROFILE_TOP
from benchmarks.report_vit_b import md_vit_b
from benchmarks.targets import BORDERLINE, Target, fmt, listed
from benchmarks.template import Template, jobs_text, load_text, md_table
from benchmarks.timing import NOISY
from benchmarks.training import TRAIN_BATCH

T = Template("report.md")
GENERATOR = "`python -m benchmarks.bench` (benchmarks/bench.py)"
NOISY_NOTE = T.text("noisy", noisy=NOISY)
WHY_TODO = "_TODO (maintainers): explanation not yet written._"
_WHY_LINE = re.compile(r"^\s*\*\*Why:\*\* (.*?) <!-- why:([\w-]+) -->\s*$", re.M)
CLICK_ROWS = (("bias explorer", "single", "new patch (trace cached)", "bias_patch"),
              ("bias explorer", "single", "new image (cold trace)", "bias_image"),
              ("compare", "all", "new patch (traces cached)", "compare_patch"),
              ("compare", "all", "new image (cold traces)", "compare_image"))


def written_whys(path: Path) -> dict[str, str]:
    """The maintainers' **Why** texts of an existing BENCHMARKS.md, by target key (kept
    when the file is rewritten and the target is still missed)."""
    if not path.is_file():
        return {}
    return {key: text for text, key in _WHY_LINE.findall(path.read_text()) if text != WHY_TODO}


def render_markdown(res: dict, tgts: list[Target], whys: dict[str, str] | None = None) -> str:
    """BENCHMARKS.md from a run's results (`bench.run`'s dict), its targets and the kept **Why** texts."""
    sections = (md_header(res), md_machine(res), md_targets(tgts, whys or {}), md_attention(res),
                md_training(res), md_clicks(res), md_app(res), md_memory(res), md_vit_b(res),
                md_functional(res), md_profile(res), md_analysis(res))
    return "\n".join(line for section in sections for line in section)


def kept_sections(old: str, new: str) -> str:
    """`new` with the numbered `## N.` sections of `old` that `new` lacks appended: the sections
    other commands write (10: `benchmarks.html_report`, 11: `benchmarks.compiled_ab`) survive a
    rerun of `benchmarks.bench`, which writes the others."""
    have = set(re.findall(r"^## (\d+)\.", new, re.M))
    parts = re.split(r"(?=^## )", old, flags=re.M)
    extra = [p.rstrip("\n") for p in parts if (m := re.match(r"## (\d+)\.", p)) and m.group(1) not in have]
    return new.rstrip("\n") + "".join("\n\n" + p for p in extra) + "\n"


def replace_section(md: str, heading: str, lines: list[str]) -> str:
    """`md` with its section that starts with the line `heading...` (up to the next `## `
    heading) replaced by `lines`; appended at the end when it has none."""
    text = "\n".join(lines).rstrip("\n") + "\n"
    m = re.search(rf"^{re.escape(heading)}.*$", md, re.M)
    if m is None:
        return md.rstrip("\n") + "\n\n" + text
    nxt = re.search(r"^## ", md[m.end():], re.M)
    end = m.end() + nxt.start() if nxt else len(md)
    return md[:m.start()] + text + ("\n" if nxt else "") + md[end:]


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" + (" †" if row[f"{key}_noisy"] else "")


# ----------------------------------------------------------------------------- the sections, in order
def md_header(res: dict) -> list[str]:
    return T.lines("header", generator=GENERATOR) + (T.lines("header.quick") if res["mode"] == "quick" else [])


def md_machine(res: dict) -> list[str]:
    env, plan = res["environment"], res["plan"]
    return T.lines("machine") + [md_table(["", ""], [
        ["date (UTC)", env["date"]], ["command", f"`{env['command']}`"], ["mode", res["mode"]],
        ["CPU", env["cpu"]], ["cores (logical / usable)", f"{env['cores']} / {env['usable_cores']}"],
        ["torch threads", env["torch_threads"]], ["python", env["python"]], ["torch", env["torch"]],
        ["SaPE² / CoPE attention", env.get("cpp_kernel", "not recorded")],
        ["streamlit", env["streamlit"]], ["numpy", env["numpy"]],
        ["playwright / chromium", f"{env['playwright']} / {env['chromium']}"],
        ["platform", env["platform"]], ["git commit", env["git_commit"]],
        ["background `vitpe_core train` at start", jobs_text(env["background_start"])],
        ["background `vitpe_core train` at end", jobs_text(env["background_end"])],
        ["load average (1/5/15 min) start → end",
         f"{load_text(env['loadavg_start'])} → {load_text(env['loadavg_end'])}"],
        ["wall time of this run", f"{res['wall_time_s']:.0f} s ("
         + ", ".join(f"{k} {v:.0f} s" for k, v in res["section_s"].items()) + ")"],
        ["repetitions", ", ".join(f"{k} {v}" for k, v in plan.items())]]), ""]


def md_targets(tgts: list[Target], whys: dict[str, str]) -> list[str]:
    """The targets' table, then one line per miss with its **Why** (`whys[key]`, else WHY_TODO)."""
    out = T.lines("targets") + [md_table(["target", "measured", "limit", "result", "best-of-N cross-check"], [
        [t.text, fmt(t.measured, t.unit), ("≤ " if t.kind == "max" else "≥ ") + fmt(t.limit, t.unit),
         f"**{t.status}**" + (f" ({t.note})" if t.status == "NOT MEASURED" and t.note else "")
         + (f" (borderline: within {BORDERLINE:.0%} of the limit)" if t.borderline else ""), t.check_text]
        for t in tgts]), ""]
    out += T.lines("targets.notes")
    if any(t.unit == "MiB" for t in tgts):
        out += T.lines("targets.gb")
    misses = [t for t in tgts if t.status == "MISS"]
    for t in misses:
        out += [f"* **MISS — {t.text}**: {fmt(t.measured, t.unit)}, {t.miss_by}.",
                f"  **Why:** {whys.get(t.key, WHY_TODO)} <!-- why:{t.key} -->"]
    if misses:
        out.append("")
    return out


def md_attention(res: dict) -> list[str]:
    out = T.lines("attention")
    for width in WIDTHS:
        for batch in BATCHES:
            rows = [r for r in res["attention"] if r["width"] == width and r["batch"] == batch]
            if not rows:
                continue
            out += T.lines("attention.group", width=width, dim=rows[0]["dim"], heads=rows[0]["heads"], batch=batch)
            out += [md_table(["encoding", "× none (SDPA)", "× rpb", "best-of-N × none / × rpb", "median ms", "min ms"],
                             [[f"`{r['encoding']}`", _ratio(r, "vs_none"), _ratio(r, "vs_rpb"),
                               f"{r['vs_none_best']:.2f} / {r['vs_rpb_best']:.2f}", f"{r['median_ms']:.2f}",
                               f"{r['min_ms']:.2f}"] for r in rows]), ""]
    if any(r[f"{k}_noisy"] for r in res["attention"] for k in ("vs_none", "vs_rpb")):
        out += [NOISY_NOTE, ""]
    return out


def md_training(res: dict) -> list[str]:
    timm = any("timm" in r["variant"] for r in res["training"])
    out = T.lines("training", batch=TRAIN_BATCH, steps=(res.get("plan") or {}).get("train_steps_per_sample", 1),
                  no_timm="" if timm else T.text("training.no_timm"))
    out += [md_table(["variant", "throughput × none", "throughput × ape", "best-of-N × none / × ape", "images/s",
                      "median ms/step", "min ms/step"],
                     [[f"`{r['variant']}`" if "reference" not in r["variant"] else r["variant"],
                       _ratio(r, "throughput_vs_none"), _ratio(r, "throughput_vs_ape"),
                       f"{r['throughput_vs_none_best']:.2f} / {r['throughput_vs_ape_best']:.2f}",
                       f"{r['images_per_s']:.0f}", f"{r['median_step_ms']:.0f}", f"{r['min_step_ms']:.0f}"]
                      for r in res["training"]]), ""]
    if any(r[f"{k}_noisy"] for r in res["training"] for k in ("throughput_vs_none", "throughput_vs_ape")):
        out += [NOISY_NOTE, ""]
    return out


def md_clicks(res: dict) -> list[str]:
    c = res["clicks"]
    who = {"single": f"`{c['single']}`" + (T.text("clicks.fresh") if c["single_fresh"] else ""),
           "all": f"all {len(c['checkpoints'])}"}
    return T.lines("clicks", images=len(c["images"])) + [
        md_table(["page", "checkpoints", "click", "n", "p50 ms", "p95 ms", "max ms", "CPU p50 ms", "CPU p95 ms"], [
            [page, who[whom], what, c[k]["n"], f"{c[k]['p50_ms']:.1f}", f"{c[k]['p95_ms']:.1f}",
             f"{c[k]['max_ms']:.1f}", f"{c[k]['cpu_p50_ms']:.1f}", f"{c[k]['cpu_p95_ms']:.1f}"]
            for page, whom, what, k in CLICK_ROWS]), "",
        checkpoint_note(c["checkpoints"], c["fresh"]), ""]


def checkpoint_note(names: list[str], fresh: list[str]) -> str:
    """Which checkpoints a table used: those from `checkpoints/` and the freshly built ones."""
    real = [n for n in names if n not in fresh]
    quoted = lambda ns: ", ".join(f"`{n}`" for n in ns)
    return (T.text("checkpoints", n=len(names), names=quoted(names)) + " "
            + (T.text("checkpoints.real", names=quoted(real)) if real else T.text("checkpoints.none")) + " "
            + (T.text("checkpoints.fresh", names=quoted(fresh)) if fresh else ""))


def md_app(res: dict) -> list[str]:
    app = res["app"]
    out = T.lines("app")
    if app.get("skipped"):
        return out + T.lines("app.skipped")
    out += T.lines("app.method", runs=len(app["runs"]), default=app["default"])
    rows = [["`/_stcore/health` answers ok (HTTP)", fmt(app.get("health_s"), "s")],
            ["`GET /` answered 200 (HTTP)", fmt(app.get("get_root_s"), "s")]]
    if app["browser"]:
        rows += [["first element (`h1`) visible (chromium)", fmt(app.get("first_element_s"), "s")],
                 ["first script run complete (chromium)", fmt(app.get("first_run_s"), "s")]]
        if "first_run_max_s" in app:     # the target's figure: every cold start
            each = ", ".join(fmt(r["first_run_s"], "s") for r in app["runs"] if "first_run_s" in r)
            rows += [[f"first script run complete (chromium), slowest of the {len(app['runs'])} ({each})",
                      fmt(app["first_run_max_s"], "s")]]
        if "first_chart_max_s" in app:   # the target's end point: what a person waits for
            each = ", ".join(fmt(r["first_chart_s"], "s") for r in app["runs"] if "first_chart_s" in r)
            rows += [["**the first page's charts drawn** (chromium)", fmt(app.get("first_chart_s"), "s")],
                     [f"**the first page's charts drawn, slowest of the {len(app['runs'])}** ({each})",
                      fmt(app["first_chart_max_s"], "s")]]
        if "floor_first_run_s" in app:    # what Streamlit and chromium alone take here
            each = ", ".join(fmt(r["first_run_s"], "s") for r in app["floor_runs"])
            rows += [["floor: a Streamlit app drawing one Plotly chart, first script run complete (chromium)",
                      fmt(app["floor_first_run_s"], "s")],
                     [f"floor, slowest of the {len(app['floor_runs'])} ({each})",
                      fmt(app["floor_first_run_max_s"], "s")]]
        if "floor_first_chart_max_s" in app:
            each = ", ".join(fmt(r["first_chart_s"], "s") for r in app["floor_runs"] if "first_chart_s" in r)
            rows += [["**floor: its chart drawn** (chromium)", fmt(app.get("floor_first_chart_s"), "s")],
                     [f"**floor: its chart drawn, slowest of the {len(app['floor_runs'])}** ({each})",
                      fmt(app["floor_first_chart_max_s"], "s")]]
        if "compare_first_run_s" in app:
            loaded = len(app["checkpoints"]) if "after_compare_all" in app else len(listed(app))
            rows += [[f"compare page, first run: {loaded} checkpoints loaded, the default "
                      f"{len(app['checkpoints'])} shown (after the bias page)", fmt(app["compare_first_run_s"], "s")]]
    out += [md_table(["measure", "median"], rows), ""] + T.lines("app.http")
    if app["browser"] and "floor_first_run_s" in app:
        out += T.lines("app.floor")
    if not app["browser"]:
        out += T.lines("app.no_browser", reason=app["browser_reason"])
    if app.get("e2e_bias"):
        e2e = [("bias explorer", app["e2e_bias"]), ("compare", app.get("e2e_compare", []))]
        out += T.lines("app.e2e") + [md_table(["page", "n", "p50 ms", "max ms"], [
            [p, len(v), f"{np.percentile(v, 50):.0f}", f"{max(v):.0f}"] for p, v in e2e if v]), ""]
    return out


def md_memory(res: dict) -> list[str]:
    app = res["app"]
    rows = [[f"training `{r['encoding']}`, {r['what']}", f"{r['vmhwm_mib']:.0f}", f"{r['vmrss_mib']:.0f}"]
            for r in res["memory"]["training"]]
    first = app["runs"][-1].get("after_first_page_mib") if app.get("runs") else None
    if first:
        rows.append(["app server after the first (bias) page", f"{first['VmHWM']:.0f}", f"{first['VmRSS']:.0f}"])
    if app.get("after_compare_all"):            # the page loads what it shows (since 2026-12-02)
        for key, what in (("after_compare", f"the default {len(app['checkpoints'])} shown and loaded"),
                          ("after_compare_all", f"then all {len(listed(app))} listed shown and loaded")):
            mem = app[key]
            rows.append([f"app server after the compare page ({what})", f"{mem['VmHWM']:.0f}", f"{mem['VmRSS']:.0f}"])
    elif app.get("after_compare"):
        mem = app["after_compare"]
        rows.append([f"app server after the compare page (all {len(listed(app))} listed checkpoints loaded, "
                     f"{len(app['checkpoints'])} shown)", f"{mem['VmHWM']:.0f}", f"{mem['VmRSS']:.0f}"])
    out = T.lines("memory", batch=TRAIN_BATCH) + [md_table(["process", "VmHWM MiB", "VmRSS MiB"], rows), ""]
    if app.get("skipped"):
        out += T.lines("memory.skipped")
    elif not app.get("after_compare"):
        out += T.lines("memory.no_browser", reason=app.get("browser_reason") or "the browser part did not run")
    return out


def md_functional(res: dict) -> list[str]:
    rows = res.get("functional")
    if not rows:
        return []
    return T.lines("functional", batch=FUNCTIONAL_BATCH) + [
        md_table(["variant", f"× {FUNCTIONAL_BASE}", "best-of-N", "median ms", "min ms"],
                 [[r["variant"], _ratio(r, "vs_base"), f"{r['vs_base_best']:.2f}", f"{r['median_ms']:.2f}",
                   f"{r['min_ms']:.2f}"] for r in rows]), ""]


def _profile_rows(phase: dict, top: int = PROFILE_TOP) -> list[list[Any]]:
    ops = sorted(phase["ops"].items(), key=lambda kv: -kv[1]["self_ms"])
    total = sum(v["self_ms"] for v in phase["ops"].values()) or 1.0
    return [[f"`{name}`", f"{v['self_ms']:.2f}", f"{100 * v['self_ms'] / total:.1f} %", f"{v['calls']:g}"]
            for name, v in ops[:top]]


def md_profile(res: dict) -> list[str]:
    pr = res.get("profile")
    if not pr:
        return []
    out = T.lines("profile", steps=pr["steps"], batch=TRAIN_BATCH, threads=pr["threads"], top=PROFILE_TOP,
                  before_commit=pr["before_commit"])
    for label, key in (("Before", "before"), ("Now", "after")):
        if key not in pr:
            out += T.lines("profile.missing", label=label, reason=pr.get("before_reason", "not measured"))
            continue
        for phase in ("forward", "backward"):
            ph = pr[key][phase]
            out += T.lines("profile.phase", label=label, phase=phase, wall_ms=ph["wall_ms"])
            out += [md_table(["op", "self ms / step", "share", "calls / step"], _profile_rows(ph)), ""]
    return out


def md_analysis(res: dict) -> list[str]:
    an = res.get("analysis")
    if not an:
        return []
    if "wall_s" not in an:
        return T.lines("analysis") + T.lines("analysis.missing", reason=an["reason"])
    return T.lines("analysis") + T.lines("analysis.measured", checkpoint=an["checkpoint"], images=an["images"]) + [
        md_table(["checkpoint", "wall s", "CPU s (all threads)", "limit"],
                 [[f"`{an['checkpoint']}`", f"{an['wall_s']:.1f}", f"{an['cpu_s']:.1f}", f"{ANALYSIS_LIMIT_S} s"]]), ""]
