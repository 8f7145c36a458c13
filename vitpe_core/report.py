"""The README's results table, regenerated from the checkpoints' metrics:
`python -m vitpe_core table --dir checkpoints`. Every number comes from a `NAME.json`
written by training / evaluation; nothing is typed in by hand except the published
reference numbers, which are labelled as theirs (docs/encodings.md)."""
from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

ORDER = [  # also the training order of scripts/train_checkpoints.sh
    "ape", "sape2+ape", "sape2", "cope+ape", "rope_mixed", "rpb", "ape2d", "sincos2d", "rope_axial", "none"]

# Published numbers (top-1 %, CIFAR-10 / CIFAR-100) to compare against (docs/encodings.md), with their budgets.
PUBLISHED = {
    "SaPE² paper (ViT-S: D 384, 12 layers, 6 heads, patch 4; 400 epochs, DeiT augmentation, 4 GPUs)": [
        ("ViT (learned APE)", 87.41, 66.54), ("2D RoPE", 89.92, 70.71), ("2D RoPE + APE", 89.98, 71.32),
        ("CoPE + APE", 92.54, 72.10), ("SaPE²", 91.06, 71.29), ("SaPE² + APE", 93.98, 72.23)],
    "compact-ViT peer (0.82 M params: D 128, 6 layers, 4 heads, MLP 256, patch 4; 200 epochs)": [
        ("none", 79.63, 53.25), ("learned", 86.52, 60.87), ("sin-cos", 86.09, 59.73),
        ("relative", 90.57, 65.11), ("RoPE", 88.49, 62.88)],
}


# The SaPE² paper's read-out ablation (CIFAR-10 top-1 %, with +APE): our `readout` option -> (their
# name, top-1). The paper's prose and code name the two the other way round; we follow its table.
SAPE2_READOUTS = {"query": ("SaPE²(K)", dict((r[0], r[1]) for rows in PUBLISHED.values() for r in rows)["SaPE² + APE"]),
                  "key": ("SaPE²(Q)", 90.17)}

PAPER_PRESET, PAPER_EPOCHS = "paper", 400   # the SaPE² paper's ViT-S and its epochs (docs/encodings.md)


@lru_cache(maxsize=None)
def flops_per_image(preset: str) -> int:
    """Forward FLOPs of one 32x32 image through a preset's `ape` model (torch's FLOP counter)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from .config import PRESETS, ViTConfig
    from .model import ViT
    shape = {k: v for k, v in PRESETS[preset].items() if k != "drop_path"}
    model = ViT(ViTConfig(**shape, encoding="ape")).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, *shape["img_size"]))
    return counter.get_total_flops()


def compute_line(metrics: dict[str, dict]) -> str | None:
    """How our training compute compares with the SaPE² paper's, if every row shares preset and epochs."""
    recipes = [m.get("recipe") or {} for m in metrics.values()]
    presets, epochs = {r.get("preset") for r in recipes}, {r.get("epochs") for r in recipes}
    if len(presets) != 1 or len(epochs) != 1 or None in presets | epochs:
        return None
    preset, ep = presets.pop(), epochs.pop()
    ours, theirs = flops_per_image(preset), flops_per_image(PAPER_PRESET)
    ratio = theirs * PAPER_EPOCHS / (ours * ep)
    return (f"Compute: a `{preset}` forward pass costs {ours / 1e6:.0f} MFLOPs per image, the SaPE² paper's ViT-S "
            f"(`--preset {PAPER_PRESET}`) {theirs / 1e6:.0f} ({theirs / ours:.1f}×); with {ep} epochs against their "
            f"{PAPER_EPOCHS}, each of our runs uses about 1/{ratio:.0f} of their training compute.")


def _fmt(v, digits=1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def load_metrics(folder: str | Path) -> dict[str, dict]:
    out = {}
    for p in sorted(Path(folder).glob("*.json")):
        try:
            out[p.stem] = json.loads(p.read_text())["metrics"]
        except (OSError, ValueError, KeyError):
            continue
    return out


def _recipe(metrics: dict, leave_out: str) -> dict:
    """A row's recipe without one key (the one rows are meant to differ in)."""
    return {k: v for k, v in (metrics.get("recipe") or {}).items() if k != leave_out}


RECIPE_KEYS = ("preset", "dataset", "epochs", "batch_size", "lr", "schedule", "augment", "seed")


def seeds_line(folder: str | Path, metrics: dict[str, dict]) -> str | None:
    """Reruns of shipped rows with other seeds (`folder/seeds/*.json`, the row's recipe but for
    the seed): the measured seed-to-seed spread that says which gaps between rows are noise."""
    def top1(m: dict) -> float | None:
        return (m.get("test") or {}).get("top1")

    runs: dict[str, dict[int, float]] = {}
    for m in load_metrics(Path(folder) / "seeds").values():
        enc = (m.get("recipe") or {}).get("encoding")
        row = metrics.get(enc)
        if row is None or _recipe(row, "seed") != _recipe(m, "seed") or None in (top1(row), top1(m)):
            continue                          # not a rerun of a shipped row with only the seed changed
        runs.setdefault(enc, {row["recipe"]["seed"]: top1(row)})[m["recipe"]["seed"]] = top1(m)
    parts = []
    for enc, by_seed in sorted(runs.items()):
        spread = max(by_seed.values()) - min(by_seed.values())
        parts.append(f"`{enc}` " + ", ".join(f"seed {k}: {v:.2f}" for k, v in sorted(by_seed.items()))
                     + f" (spread {spread:.2f} points)")
    if not parts:
        return None
    return "Seed check, shipped rows rerun with other seeds (`checkpoints/seeds/`): " + "; ".join(parts) + "."


def recipe_line(metrics: dict[str, dict]) -> str:
    """One line saying whether every row shares one recipe (all but the encoding), read from the JSONs."""
    recipes = {n: _recipe(m, "encoding") for n, m in metrics.items()}
    distinct = {json.dumps(r, sort_keys=True) for r in recipes.values()}
    if len(distinct) == 1:
        r = next(iter(recipes.values()))
        return ("One recipe for every row (identical in each JSON but for the encoding): "
                + ", ".join(f"{k} {r[k]}" for k in RECIPE_KEYS if k in r) + ".")
    keys = sorted({k for r in recipes.values() for k in r})
    differ = [k for k in keys if len({json.dumps(r.get(k), sort_keys=True) for r in recipes.values()}) > 1]
    groups: dict[str, list[str]] = {}
    for n, r in recipes.items():
        groups.setdefault(", ".join(f"{k} {r.get(k)}" for k in differ), []).append(n)
    return (f"Rows differ in recipe ({', '.join(differ)}), so they do not compare directly: "
            + "; ".join(f"{' '.join(f'`{n}`' for n in ns)}: {g}" for g, ns in groups.items()) + ".")


def results_table(folder: str | Path = "checkpoints") -> str:
    metrics = load_metrics(folder)
    names = [n for n in ORDER if n in metrics] + sorted(set(metrics) - set(ORDER))
    head = ("| encoding | top-1 | top-5 | 24 px | 40 px | 48 px | agree ½-patch | agree 1-patch | bias shift err "
            "| 2D score | rel. score | params | epochs | train min | img/s |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for n in names:
        m = metrics[n]
        res = m.get("resolution", {})
        tr = m.get("translation", {})
        top1 = lambda s: res.get(s, {}).get("top1")
        agree = lambda k: tr.get(k, {}).get("agreement")
        half = [v for v in (agree("half_x"), agree("half_y")) if v is not None]
        whole = [v for v in (agree("whole_x"), agree("whole_y")) if v is not None]
        err = tr.get("whole_x", {}).get("bias_shift_error")
        score = m.get("structure", {}).get("spearman")
        rel = (m.get("position") or {}).get("relative_score")
        lines.append(
            f"| `{n}` | {_fmt(m.get('test', {}).get('top1'), 2)} | {_fmt(m.get('test', {}).get('top5'), 2)} "
            f"| {_fmt(top1('24'))} | {_fmt(top1('40'))} | {_fmt(top1('48'))} "
            f"| {_fmt(sum(half) / len(half) if half else None)} | {_fmt(sum(whole) / len(whole) if whole else None)} "
            f"| {_fmt(err, 3)} | {_fmt(score, 2)} | {_fmt(rel, 2)} | {m.get('parameters', 0) / 1e6:.3f} M "
            f"| {m.get('epochs', '—')} "
            f"| {_fmt(m.get('wall_time_s', 0) / 60, 0)} | {_fmt(m.get('images_per_s'), 0)} |")
    if not names:
        lines.append("| (no checkpoints yet) |" + " |" * (head.count("|") - 2))
    seeds = seeds_line(folder, metrics)
    if seeds:
        lines += ["", seeds]
    if names:
        lines += ["", recipe_line(metrics)]
        compute = compute_line(metrics)
        if compute:
            lines += ["", compute]
    missing = [n for n in ORDER if n not in metrics]
    if missing:
        lines += ["", f"Not trained yet ({len(missing)} of {len(ORDER)}): "
                  + ", ".join(f"`{n}`" for n in missing) + " — `bash scripts/train_checkpoints.sh` resumes them."]
    elif names:
        hours = sum(m.get("wall_time_s") or 0 for m in metrics.values()) / 3600
        lines += ["", f"All {len(ORDER)} trained: {hours:.1f} hours of training in all (the sum of the runs' "
                      "`wall_time_s`)."]
    pub = ["", "Published numbers (theirs, not reproduced here; top-1 %):", ""]
    for budget, rows in PUBLISHED.items():
        pub += [f"*{budget}*", "", "| model | CIFAR-10 | CIFAR-100 |", "|---|---|---|"]
        pub += [f"| {a} | {b:.2f} | {c:.2f} |" for a, b, c in rows] + [""]
    return "\n".join(lines + pub)


# ----------------------------------------------------------------------------- the budget study
STUDY = ("none", "ape", "sape2", "sape2+ape")   # scripts/train_study.sh's encodings
LONG_EPOCHS = 50


def _top1(m: dict | None) -> float | None:
    return ((m or {}).get("test") or {}).get("top1")


def _bias_ratio(m: dict | None) -> float | None:
    """The SaPE² bias's std over the q·k logits' std at the last epoch, averaged over layers
    (`enc_bias_ratio_L*` curves; runs from before they were recorded have none)."""
    curves = (m or {}).get("curves") or {}
    last = [c[-1] for k, c in curves.items() if k.startswith("enc_bias_ratio_L") and c]
    return sum(last) / len(last) if last else None


def _gap(a: float | None, b: float | None) -> str:
    return "—" if a is None or b is None else f"{a - b:+.2f}"


ALONG = (("sape2", "none"), ("sape2", "ape"), ("sape2+ape", "sape2"), ("sape2+ape", "ape"))  # curve_gap pairs


def budget_table(folder: str | Path = "checkpoints", runs: str | Path | None = None) -> str:
    """Top-1 of the study's encodings at 15 epochs (the shipped rows, seed 0, and their seed-1
    reruns in `folder/seeds`) and at 50 (`folder/long`), the SaPE² − none and SaPE² − APE gaps
    at each budget, the gaps along the 50-epoch runs (`ALONG`), the APE table's 2D-structure score
    and SaPE²'s bias scale. Rows whose recipe differs from the shipped row's in more than the seed
    or epochs are left out. Runs not shipped yet are listed with their progress from `runs`
    (default: `runs/` beside `folder`)."""
    folder = Path(folder)
    run_dir = Path(runs) if runs is not None else folder.resolve().parent / "runs"
    main, seeds, long = (load_metrics(folder), load_metrics(folder / "seeds"), load_metrics(folder / "long"))
    seed1 = {n.removesuffix("-seed1"): m for n, m in seeds.items() if n.endswith("-seed1")}

    def same(m: dict | None, leave: str) -> dict | None:   # a rerun of a shipped row with only `leave` changed
        row = main.get(_enc(m)) if m else None
        return m if row and _recipe(row, leave) == _recipe(m, leave) else None

    rows = {n: (main.get(n), same(seed1.get(n), "seed"), same(long.get(n), "epochs")) for n in STUDY}
    head = ("| encoding | top-1, 15 epochs (seed 0) | 15 epochs (seed 1) | top-1, 50 epochs | 2D score 15 → 50 "
            "| bias / logit std 15 → 50 |")
    lines = [head, "|" + "|".join(["---"] * (head.count("|") - 1)) + "|"]
    for n, (short, s1, lng) in rows.items():
        score = lambda m: (m or {}).get("structure", {}).get("spearman")
        ratio = [_bias_ratio(s1) if _bias_ratio(short) is None else _bias_ratio(short), _bias_ratio(lng)]
        lines.append(f"| `{n}` | {_fmt(_top1(short), 2)} | {_fmt(_top1(s1), 2)} | {_fmt(_top1(lng), 2)} "
                     f"| {_fmt(score(short), 2)} → {_fmt(score(lng), 2)} | {_fmt(ratio[0], 3)} → {_fmt(ratio[1], 3)} |")
    top = {n: [_top1(m) for m in ms] for n, ms in rows.items()}
    mean15 = {n: _mean([t[0], t[1]]) for n, t in top.items()}
    n_seeds = lambda n: sum(v is not None for v in top[n][:2])   # 15-epoch runs of `n`
    for other, label in (("none", "no encoding"), ("ape", "a learned table (APE)")):
        lines += ["", f"SaPE² − {label}: {_gap(top['sape2'][0], top[other][0])} points at 15 epochs (seed 0), "
                      f"{_gap(mean15['sape2'], mean15[other])} between the 15-epoch means over seeds "
                      f"({n_seeds('sape2')} run(s) of `sape2`, {n_seeds(other)} of `{other}`), "
                      f"{_gap(top['sape2'][2], top[other][2])} at {LONG_EPOCHS} epochs."]
    label = {"sape2": "SaPE²", "sape2+ape": "SaPE²+APE"}
    for first, other in ALONG:
        along = curve_gap(rows[first][2], rows[other][2])
        if along:
            lines += ["", f"Along the {LONG_EPOCHS}-epoch runs (test top-1 after each epoch), {label[first]} − "
                          f"`{other}`: " + along + "."]
    spread = {n: abs(t[0] - t[1]) for n, t in top.items() if None not in t[:2]}
    if spread:
        lines += ["", "Seed spread at 15 epochs: " + ", ".join(f"`{n}` {v:.2f}" for n, v in spread.items())
                  + " points."]
    todo = [f"`{kind}:{n}`" + _progress(run_dir, kind, n) for n, (_, s1, lng) in rows.items()
            for kind, m in (("seed1", s1), ("long", lng)) if m is None and not (kind == "seed1" and n == "sape2+ape")]
    if todo:
        lines += ["", f"Not finished yet ({len(todo)}): {', '.join(todo)} — `bash scripts/train_study.sh data` "
                      "resumes them."]
    return "\n".join(lines)


def curve_gap(a: dict | None, b: dict | None, marks: int = 5) -> str | None:
    """How run `a`'s test top-1 leads run `b`'s epoch by epoch (runs of the same length): the gap
    at `marks` evenly spaced epochs and the last, and at how many epochs `a` was ahead."""
    ta, tb = (((m or {}).get("curves") or {}).get("test_top1") or [] for m in (a, b))
    if not ta or len(ta) != len(tb):
        return None
    n = len(ta)
    at = sorted({max(1, round(n * k / marks)) for k in range(1, marks + 1)})
    ahead = sum(x > y for x, y in zip(ta, tb))
    return (", ".join(f"{ta[e - 1] - tb[e - 1]:+.2f} at epoch {e}" for e in at)
            + f"; ahead after {ahead} of {n} epochs")


STUDY_RUNS = {"long": "long/{}", "seed1": "seeds/{}-seed1"}   # job kind -> run folder (scripts/train_study.sh)


def _progress(runs: Path, kind: str, name: str) -> str:
    """` (E of N epochs done)` for a study run with a resumable state in `runs`, else ``."""
    path = runs / STUDY_RUNS[kind].format(name) / "state.pt"
    if not path.is_file():
        return ""
    from .train import load_state
    try:
        state = load_state(path)
        done, total = len(state["curves"].get("epoch", [])), state["train_config"]["epochs"]
    except Exception as e:  # a state the trainer could not resume either: say so, do not fail the table
        return f" (unreadable state: {type(e).__name__})"
    return f" ({done} of {total} epochs done)"


def _enc(m: dict) -> str | None:
    return (m.get("recipe") or {}).get("encoding")


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


MARKERS = ("<!-- results:start -->", "<!-- results:end -->")
BUDGET_MARKERS = ("<!-- budget:start -->", "<!-- budget:end -->")


def block(text: str, markers: tuple[str, str]) -> str | None:
    """The text between a pair of markers, or None when the file lacks them."""
    if markers[0] not in text or markers[1] not in text:
        return None
    return text[text.index(markers[0]) + len(markers[0]):text.index(markers[1])]


def update_readme(readme: str | Path, folder: str | Path = "checkpoints") -> None:
    """Replace the text between the README's results markers (and its budget-study markers, if
    it has them) with freshly generated tables."""
    path = Path(readme)
    text = path.read_text()
    for markers, make in ((MARKERS, results_table), (BUDGET_MARKERS, budget_table)):
        if block(text, markers) is None:
            continue
        start, end = text.index(markers[0]) + len(markers[0]), text.index(markers[1])
        text = text[:start] + "\n" + make(folder) + "\n" + text[end:]
    path.write_text(text)
