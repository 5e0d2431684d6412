#!/usr/bin/python3
"""Draws docs/architecture.svg, the picture of mpnfs's layers in the README
and docs/ARCHITECTURE.md, from the table below (run it after changing the
table: python3 docs/architecture.py)."""
import html
import os

# (column, row, width in columns, title, lines): column 0..2, row from the top.
BOXES = [
    (0, 0, 3, "applications", ["unchanged: databases, tools"]),
    (0, 1, 3, "kernel FUSE", ["/dev/fuse, page cache"]),
    (0, 2, 2, "src/fuse", ["FUSE front end (low-level API)", "locks: fcntl, OFD, flock"]),
    (0, 3, 2, "src/fs", ["inodes, attributes, close-to-open,", "write-behind, COMMIT, write order"]),
    (2, 3, 1, "src/cache", ["SSD cache: 2Q, CRCs,", "crash-safe index, write-back"]),
    (0, 4, 2, "src/nfs", ["NFSv3 calls, typed and async;", "MOUNT; the NLM lock client"]),
    (2, 4, 1, "locks", ["fs/locks: NLM v4, reclaim", "nfs/nlm: over the first path"]),
    (0, 5, 3, "src/proto", ["XDR codecs: RPC, NFSv3, MOUNT, PORTMAP, NLM, NSM; bounded, fuzzed"]),
    (0, 6, 3, "src/engine", ["paths, connections, event loops; least outstanding work; failover"]),
]
COL_W, ROW_H, GAP, PAD = 250, 74, 14, 20
PATHS = 4


def box(x, y, w, h, title, lines, fill):
    out = [f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{fill}" stroke="#345" />',
           f'<text x="{x + 10}" y="{y + 22}" font-weight="bold">{html.escape(title)}</text>']
    for i, line in enumerate(lines):
        out.append(f'<text x="{x + 10}" y="{y + 42 + 16 * i}" font-size="13">{html.escape(line)}</text>')
    return out


def main():
    width = PAD * 2 + COL_W * 3 + GAP * 2
    rows = max(b[1] for b in BOXES) + 1
    server_y = PAD + rows * (ROW_H + GAP) + 90
    height = server_y + ROW_H + 24 + PAD
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="DejaVu Sans, sans-serif" font-size="15">',
           '<defs><marker id="a" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#345" /></marker></defs>',
           f'<rect width="{width}" height="{height}" fill="white" />']
    for col, row, span, title, lines in BOXES:
        x = PAD + col * (COL_W + GAP)
        y = PAD + row * (ROW_H + GAP)
        w = COL_W * span + GAP * (span - 1)
        fill = "#e8eef6" if row >= 2 else "#f4f4f4"
        svg += box(x, y, w, ROW_H, title, lines, fill)
        if row > 0 and col == 0:
            mid = PAD + (COL_W * 2 + GAP) // 2
            svg.append(f'<line x1="{mid}" y1="{y - GAP}" x2="{mid}" y2="{y}" stroke="#345" marker-end="url(#a)" />')
    # The side boxes hang off the layer beside them.
    for row in (3, 4):
        y = PAD + row * (ROW_H + GAP) + ROW_H // 2
        x0 = PAD + COL_W * 2 + GAP
        svg.append(f'<line x1="{x0}" y1="{y}" x2="{x0 + GAP}" y2="{y}" stroke="#345" marker-end="url(#a)" />')
    engine_bottom = PAD + (rows - 1) * (ROW_H + GAP) + ROW_H
    server_x, server_w = PAD + COL_W // 2, COL_W * 2 + GAP
    for i in range(PATHS):
        x = PAD + 60 + i * (width - 2 * PAD - 120) // (PATHS - 1)
        sx = server_x + 60 + i * (server_w - 120) // (PATHS - 1)
        svg.append(f'<line x1="{x}" y1="{engine_bottom}" x2="{sx}" y2="{server_y}" stroke="#345" '
                   f'stroke-width="2" marker-end="url(#a)" />')
        svg.append(f'<text x="{(x + sx) // 2 + 8}" y="{(engine_bottom + server_y) // 2 + 5}" '
                   f'font-size="13">path {i + 1}</text>')
    svg += box(server_x, server_y, server_w, ROW_H, "NFS server",
               ["NFSv3, MOUNT v3, NLM v4 and its status monitor"], "#f4f4f4")
    svg.append(f'<text x="{PAD}" y="{server_y + ROW_H + 24}" font-size="13">TCP over up to 8 network paths '
               '(each bound to its own interface with local=), one or more connections each</text>')
    svg.append("</svg>")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "architecture.svg")
    with open(out, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
