"""The benchmark's targets: what each one measures, its limit, and its verdict (PASS / MISS /
NOT MEASURED, borderline within `BORDERLINE` of the limit), read from a run's results
(`targets(res)`). Ratio targets carry the best-of-N ratio as a cross-check."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from benchmarks.analysis_budget import ANALYSIS_LIMIT_S

GB = 1e9
BORDERLINE = 0.05    # a target measured this close to its limit is marked borderline


@dataclass
class Target:
    key: str
    text: str            # what is measured
    limit: float
    kind: str            # "max": measured <= limit passes; "min": measured >= limit passes
    unit: str            # "x" ratio, "ms", "s", "MiB"
    measured: float | None = None
    note: str = ""
    check: float | None = None   # the best-of-N ratio, for ratio targets

    def verdict(self, value: float | None) -> str:
        if value is None:
            return "NOT MEASURED"
        ok = value <= self.limit if self.kind == "max" else value >= self.limit
        return "PASS" if ok else "MISS"

    @property
    def status(self) -> str:
        return self.verdict(self.measured)

    @property
    def borderline(self) -> bool:
        """Within BORDERLINE of the limit: another run on a loaded machine may flip the verdict."""
        return self.measured is not None and abs(self.measured / self.limit - 1) < BORDERLINE

    @property
    def check_text(self) -> str:
        if self.check is None:
            return "—"
        same = self.verdict(self.check) == self.status
        return f"{fmt(self.check, self.unit)} ({'same verdict' if same else '**verdict differs**'})"

    @property
    def miss_by(self) -> str:
        if self.status != "MISS":
            return ""
        m, lim = self.measured, self.limit
        if self.kind == "max":
            return f"{fmt(m - lim, self.unit)} over the limit ({100 * (m / lim - 1):.0f} % over)"
        return f"{fmt(lim - m, self.unit)} under the limit ({100 * (1 - m / lim):.0f} % under)"


def fmt(v: float | None, unit: str) -> str:
    """A measured value or limit as the report writes it (`—` when not measured)."""
    if v is None:
        return "—"
    if unit == "x":
        return f"{v:.2f}x"
    if unit == "ms":
        return f"{v:.1f} ms"
    if unit == "s":
        return f"{v:.2f} s"
    return f"{v:.0f} {unit}"


def listed(app: dict) -> list[str]:
    """The checkpoints the app listed (its groups' too); results from before this was recorded
    listed only the main folder's."""
    return app.get("listed") or app.get("checkpoints") or []


def targets(res: dict) -> list[Target]:
    """Every target of a run's results (`bench.run`'s dict, or a benchmarks.json), in the report's order."""
    attn = {(r["width"], r["batch"], r["encoding"]): r for r in res["attention"]}
    train = {r["variant"]: r for r in res["training"]}
    clicks, app = res["clicks"], res["app"]
    mib_1gb = GB / 2**20
    out = [
        # targets of the speed issue: they must hold on Intel and AMD alike (the report names the CPU)
        Target("sape2_attention_vs_rpb", "SaPE² attention layer fwd+bwd / `rpb`, compact, batch 128", 1.3, "max", "x",
               attn.get(("compact", 128, "sape2"), {}).get("vs_rpb"),
               check=attn.get(("compact", 128, "sape2"), {}).get("vs_rpb_best")),
        Target("sape2_training_vs_ape", "SaPE² training throughput / `ape` (compact, batch 128)", 0.9, "min", "x",
               train.get("sape2", {}).get("throughput_vs_ape"),
               check=train.get("sape2", {}).get("throughput_vs_ape_best")),
        Target("cope_training_vs_ape", "CoPE+APE training throughput / `ape` (compact, batch 128)", 0.8, "min", "x",
               train.get("cope+ape", {}).get("throughput_vs_ape"),
               check=train.get("cope+ape", {}).get("throughput_vs_ape_best")),
        Target("bias_click_patch_p95",
               f"bias explorer click, new patch (trace cached), p95 compute, `{clicks['single']}`",
               50, "max", "ms", clicks["bias_patch"]["p95_ms"]),
        Target("bias_click_image_p95", f"bias explorer, new image (cold trace), p95 compute, `{clicks['single']}`",
               50, "max", "ms", clicks["bias_image"]["p95_ms"]),
        Target("compare_click_patch_p95",
               f"compare page click, new patch, p95 compute, {len(clicks['checkpoints'])} checkpoints",
               300, "max", "ms", clicks["compare_patch"]["p95_ms"]),
        Target("compare_click_image_p95",
               f"compare page, new image (cold traces), p95 compute, {len(clicks['checkpoints'])} checkpoints",
               300, "max", "ms", clicks["compare_image"]["p95_ms"]),
    ]
    skipped = "skipped (--skip-app)" if app.get("skipped") else ""
    no_browser = skipped or (app.get("browser_reason") or "")
    after = app.get("after_compare_all") or app.get("after_compare") or {}   # older results: the page loaded all
    floor = app.get("floor_first_chart_max_s")                               # the first chart's floor, this run
    out += [
        Target("cold_start_http", "app cold start: process start -> `GET /` answered (HTTP only)", 5, "max", "s",
               app.get("get_root_s"), skipped),
        Target("cold_start_first_element", "app cold start: process start -> first element shown (browser)", 5, "max",
               "s", app.get("first_element_s"), no_browser),
        Target("cold_start_first_chart", f"app cold start: process start -> the first page's charts drawn "
               f"(browser), slowest of {len(app.get('runs') or []) or 'the'} cold starts, within 1.0 s of the "
               f"floor's (a Streamlit app drawing one Plotly chart: {fmt(app.get('floor_first_chart_max_s'), 's')})",
               (floor + 1.0) if floor else 1.0, "max", "s", app.get("first_chart_max_s") if floor else None,
               no_browser or ("" if floor else "no floor measured")),
        Target("app_memory_peak", f"app server peak resident (VmHWM) with all {len(listed(app))} "
               "listed checkpoints loaded (compare page)", mib_1gb, "max", "MiB", after.get("VmHWM"), no_browser),
        Target("app_memory_rss", "app server resident (VmRSS) after the compare page showing all", mib_1gb, "max",
               "MiB", after.get("VmRSS"), no_browser),
    ]
    an = res.get("analysis")
    if an:
        out.append(Target("analysis_budget", f"`python -m vitpe_core analyze` (`positional.analyze`, no cache), "
                          f"`{an['checkpoint']}`", ANALYSIS_LIMIT_S, "max", "s", an.get("wall_s"),
                          an.get("reason", "")))
    return out + vit_b_targets(res)


def vit_b_targets(res: dict) -> list[Target]:
    """Section 6's targets, where the run (or a `--only vit-b` run merged into it) has it."""
    vb = res.get("vit_b")
    if not vb:
        return []
    ape = vb["ape"]
    return [
        Target("vit_b_click_bias_p95", "ViT-B/16 (`ape`, 14×14), bias explorer click, new patch (trace cached), "
               "p95 compute", 100, "max", "ms", ape["clicks"]["bias"]["p95_ms"]),
        Target("vit_b_click_compare_p95", "ViT-B/16 (`ape`, 14×14), compare page click, its panel (trace cached), "
               "p95 compute", 100, "max", "ms", ape["clicks"]["compare"]["p95_ms"]),
        Target("vit_b_image_p95", "ViT-B/16 (`ape`, 224 px), new image: input + trace + attention stats + views, "
               "p95", 2, "max", "s", ape["image"]["total"]["p95_ms"] / 1e3),
    ]


def target_records(tgts: list[Target]) -> list[dict]:
    """The targets as benchmarks.json stores them (with their verdicts)."""
    return [{**asdict(t), "status": t.status, "miss_by": t.miss_by, "borderline": t.borderline} for t in tgts]
