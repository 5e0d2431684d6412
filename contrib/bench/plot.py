#!/usr/bin/python3
"""Draws the charts of docs/BENCHMARKS.md from the benchmark reports recorded beside this
script (their tables and JSON lines are the data; nothing is typed in here):

  charts/multipath-scaling.svg  MULTIPATH.md "Scaling over paths": MB/s
                                against the number of paths, with the ideal
                                (n x one path)
  charts/failover.svg           MULTIPATH.md "A path fails": MB/s per half
                                second while a path is taken down
  charts/cache-hits.svg         HITS.md: read hit ratio over time from a cold
                                cache

A chart whose report is missing is skipped with a note. Needs matplotlib
(Debian: python3-matplotlib; contrib/deps.sh --bench installs it).
  contrib/bench/plot.py
"""
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CHARTS = os.path.join(HERE, "charts")
# Deterministic SVG output (no date, fixed ids), so an unchanged report
# gives an unchanged file.
matplotlib.rcParams["svg.hashsalt"] = "mpnfs"
META = {"Date": None}


def report(name):
    path = os.path.join(HERE, name)
    if not os.path.exists(path):
        print(f"plot: {name} not found, its chart is skipped", file=sys.stderr)
        return None
    return open(path).read()


def section(text, title_start):
    """The lines of the markdown section whose heading starts with title_start."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("## "):
            inside = line[3:].startswith(title_start)
            continue
        if inside:
            out.append(line)
    return out


def recorded(text):
    m = re.search(r"Recorded ([^\n]*?) on", text)
    c = re.search(r"mpnfs ([0-9a-f]{7,})", text)
    return f"recorded {m.group(1) if m else '?'}, mpnfs {c.group(1) if c else '?'}"


def number(cell):
    m = re.match(r"\s*([0-9.]+)", cell)
    return float(m.group(1)) if m else None


def save(fig, name):
    os.makedirs(CHARTS, exist_ok=True)
    path = os.path.join(CHARTS, name)
    fig.savefig(path, metadata=META)
    plt.close(fig)
    print(f"plot: wrote {os.path.relpath(path, os.path.dirname(os.path.dirname(HERE)))}")


def finish(fig, ax, title, text, name, xlabel, ylabel, **legend):
    """The common dressing of a chart, and saving it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(**legend)
    ax.set_title(title + "\n" + recorded(text), fontsize=9)
    fig.tight_layout()
    save(fig, name)


def scaling():
    text = report("MULTIPATH.md")
    if text is None:
        return
    rows = []
    for line in section(text, "Scaling over paths"):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and re.fullmatch(r"[0-9]+", cells[0]):
            rows.append((int(cells[0]), number(cells[1]), number(cells[3])))
    if not rows:
        print("plot: MULTIPATH.md has no scaling table", file=sys.stderr)
        return
    rate = re.search(r"Scaling over paths of ([0-9]+) mbit", text)
    n = [r[0] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(n, [rows[0][1] * k for k in n], "k:", label="ideal (n x one path)")
    ax.plot(n, [r[1] for r in rows], "o-", label="sequential write")
    ax.plot(n, [r[2] for r in rows], "s-", label="sequential read (one dd)")
    ax.set_xticks(n)
    ax.set_ylim(bottom=0)
    finish(fig, ax, "Scaling over paths", text, "multipath-scaling.svg",
           f"paths ({rate.group(1) if rate else '?'} mbit each)", "MB/s")


def failover():
    text = report("MULTIPATH.md")
    if text is None:
        return
    runs = [json.loads(l) for l in section(text, "A path fails") if l.startswith("{")]
    if not runs:
        print("plot: MULTIPATH.md has no failover runs", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        y = r["per_half_second_mbs"]
        x = [0.5 * i for i in range(len(y))]
        ax.plot(x, y, drawstyle="steps-post",
                label=f"{r['mode']}: longest wait {r['stall_s']} s"
                      + (f" (final fsync {r['final_fsync_s']} s)" if r.get("final_fsync_s") else "")
                      + f", {r['before_mbs']} -> {r['after_mbs']} MB/s")
    down = runs[0]["down_at"]
    ax.axvline(down, color="red", linestyle="--", label="path taken down")
    ax.set_ylim(bottom=0)
    finish(fig, ax, "A path fails during a transfer (4 paths)", text, "failover.svg",
           "seconds", "MB/s (per half second)", fontsize=8)


def cache_hits():
    text = report("HITS.md")
    if text is None:
        return
    runs = [json.loads(l) for l in text.splitlines() if l.startswith("{")]
    if not runs:
        print("plot: HITS.md has no series", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        y = [None if v is None else 100 * v for v in r["per_second"]]
        x = list(range(1, len(y) + 1))
        ax.plot(x, y, label=f"{r['label']} (last 10 s: {100 * r['last_10s_hit_ratio']:.1f}%)")
    ax.set_ylim(0, 100)
    finish(fig, ax, "SSD cache read hits over time (OLTP-like reads)", text, "cache-hits.svg",
           "seconds from a cold cache", "read hit ratio, each second (%)", fontsize=8, loc="lower right")


if __name__ == "__main__":
    scaling()
    failover()
    cache_hits()
