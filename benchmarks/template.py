"""The report's Markdown: its prose lives in template files (benchmarks/templates/*.md), read
here; the table helpers the renderers share.

A template file holds named snippets. A line `<!-- name -->` starts the snippet `name`, which
runs to the next such line; text before the first one documents the file and is not used.
A snippet is paragraphs separated by blank lines; the lines of one paragraph are joined with
single spaces, so templates can be wrapped while BENCHMARKS.md keeps one line per paragraph
(a rerun's diff is then per paragraph). Placeholders are `str.format` fields (`{name}`,
`{value:.1f}`); a snippet's text is otherwise kept as written, a leading space included (a
fragment that continues a sentence).
"""
from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).with_name("templates")
_SNIPPET = re.compile(r"^<!-- ([\w.]+) -->$", re.M)


@cache
def snippets(file: str) -> dict[str, list[str]]:
    """`templates/<file>`'s snippets: name -> its paragraphs, each one line."""
    parts = _SNIPPET.split((TEMPLATES / file).read_text())
    return {name: [" ".join(line.rstrip() for line in p.split("\n"))
                   for p in re.split(r"\n[ \t]*\n", body.strip("\n")) if p.strip()]
            for name, body in zip(parts[1::2], parts[2::2])}


class Template:
    """The snippets of one template file, formatted: `lines` for paragraphs (each followed by
    a blank line, as the report's sections are laid out), `text` for a one-paragraph snippet."""

    def __init__(self, file: str) -> None:
        self.file = file

    def lines(self, name: str, **fields: Any) -> list[str]:
        out = []
        for paragraph in snippets(self.file)[name]:
            out += [paragraph.format(**fields), ""]
        return out

    def text(self, name: str, **fields: Any) -> str:
        (paragraph,) = snippets(self.file)[name]
        return paragraph.format(**fields)


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A Markdown table (one string, its lines joined)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def load_text(avg: list[float]) -> str:
    """A load average (1/5/15 min) as `1.0/0.5/0.2`."""
    return "/".join(f"{x:.1f}" for x in avg)


def jobs_text(jobs: list[dict]) -> str:
    """Background `vitpe_core train` jobs (`harness.background_jobs`) in a sentence: the busy
    and stopped ones each, the sleeping ones counted."""
    if not jobs:
        return "none"
    names = {"T": "**stopped (paused)**", "R": "running", "D": "running (waiting on I/O)"}
    busy = [j for j in jobs if j["state"] != "S"]
    idle = [j for j in jobs if j["state"] == "S"]
    parts = [f"pid {j['pid']} `{j['args']}`: {names.get(j['state'], j['state'])}" for j in busy]
    if idle:
        parts.append(f"{len(idle)} sleeping (pids {', '.join(str(j['pid']) for j in idle)})")
    return "; ".join(parts)
