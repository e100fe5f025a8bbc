"""Pictures of a bound mask: tile classes as Unicode blocks or a PNG, and the per-pair mask when small.

Pure rendering: functions take arrays (``classes`` int8[QT, KT] with 0 EMPTY, 1 PARTIAL, 2 FULL, and
``dense`` bool[S, K]) and return text or write one image; nothing here knows about the passes.
"""
from __future__ import annotations

import numpy as np

from maskc.kernel_ir import EMPTY, FULL, PARTIAL

GLYPHS = {FULL: "█", PARTIAL: "▒", EMPTY: "·"}
NAMES = {FULL: "FULL", PARTIAL: "PARTIAL", EMPTY: "EMPTY"}
# PNG colours: FULL and EMPTY tiles need no masking; PARTIAL ones run the predicate (amber = work).
COLOURS = {FULL: (46, 125, 50), PARTIAL: (255, 179, 0), EMPTY: (236, 236, 236)}
VISIBLE_SHADE = 0.55     # a visible pair is its tile's colour darkened, so the class stays readable


def tile_counts(classes: np.ndarray) -> dict[str, int]:
    """How many tiles of each class, by name, in FULL, PARTIAL, EMPTY order."""
    return {NAMES[c]: int((classes == c).sum()) for c in (FULL, PARTIAL, EMPTY)}


def downsample(classes: np.ndarray, factor: int) -> np.ndarray:
    """factor x factor tiles per cell: FULL or EMPTY only if every tile of the cell is, else PARTIAL."""
    if factor == 1:
        return classes
    qt, kt = classes.shape
    rows, cols = -(-qt // factor), -(-kt // factor)
    # Pad with a marker that agrees with anything, so ragged edge cells keep their class.
    padded = np.full((rows * factor, cols * factor), -1, np.int8)
    padded[:qt, :kt] = classes
    blocks = padded.reshape(rows, factor, cols, factor).transpose(0, 2, 1, 3).reshape(rows, cols, -1)
    out = np.full((rows, cols), PARTIAL, np.int8)
    for c in (FULL, EMPTY):
        out[np.all((blocks == c) | (blocks == -1), axis=2)] = c
    return out


def scale_for(shape: tuple[int, int], max_cells: int) -> int:
    """The smallest factor that fits both dimensions into ``max_cells`` (same on both axes, so
    the picture keeps the mask's geometry)."""
    return max(1, -(-max(shape) // max_cells))


def legend(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    computed = counts["FULL"] + counts["PARTIAL"]
    items = "   ".join(f"{GLYPHS[c]} {NAMES[c]} {counts[NAMES[c]]}" for c in (FULL, PARTIAL, EMPTY))
    return f"{items}   ({total} tiles, {100.0 * computed / max(total, 1):.1f}% computed)"


def _boxed(rows: list[str]) -> list[str]:
    width = len(rows[0]) if rows else 0
    return ["┌" + "─" * width + "┐"] + ["│" + r + "│" for r in rows] + ["└" + "─" * width + "┘"]


def render_tiles(classes: np.ndarray, block_m: int | None = None, block_n: int | None = None,
                 max_width: int = 80) -> str:
    """The tile grid (one character per tile, or per factor x factor tiles when it would be wider
    than ``max_width``), a header with its size and scale, and a legend with the exact counts."""
    qt, kt = classes.shape
    factor = scale_for(classes.shape, max_width - 2)
    cells = downsample(classes, factor)
    sizes = f" of {block_m}x{block_n}" if block_m and block_n else ""
    head = [f"{qt} q_blocks x {kt} kv_blocks{sizes} (rows: queries, columns: keys)"]
    if factor > 1:
        head.append(f"scale: 1 cell = {factor}x{factor} tiles (a cell is FULL or EMPTY only if all its tiles are)")
    grid = ["".join(GLYPHS[int(c)] for c in row) for row in cells]
    return "\n".join(head + _boxed(grid) + [legend(tile_counts(classes))])


def render_dense(dense: np.ndarray) -> str:
    """The per-pair mask, one character per (q, k): █ visible, · hidden."""
    grid = ["".join("█" if v else "·" for v in row) for row in dense]
    return "\n".join([f"{dense.shape[0]} queries x {dense.shape[1]} keys"] + _boxed(grid)
                     + ["█ visible   · hidden"])


def render_png(classes: np.ndarray, path: str, block_m: int, block_n: int,
               dense: np.ndarray | None = None, title: str = "", size: int = 768) -> None:
    """Write a PNG: tiles coloured by class, tile borders, the visible pairs over them when
    ``dense`` is given, and a legend. Needs pillow (imported here only)."""
    from PIL import Image, ImageDraw, ImageFont

    qt, kt = classes.shape
    if dense is not None:
        s, k = dense.shape
        px = max(1, size // max(s, k))                 # pixels per (q, k) pair
        tile_h, tile_w = block_m * px, block_n * px
        width, height = k * px, s * px
    else:
        cell = max(1, size // max(qt, kt))
        tile_h = tile_w = cell
        width, height = kt * cell, qt * cell
    font = ImageFont.load_default(size=14)
    legend_h = 30 + (22 if title else 0)
    margin = 8
    img = Image.new("RGB", (max(width, 480) + 2 * margin, height + legend_h + 2 * margin), "white")
    draw = ImageDraw.Draw(img)
    rgb = np.zeros((height, width, 3), np.uint8)
    for c, colour in COLOURS.items():
        mask = np.kron(classes == c, np.ones((tile_h, tile_w), bool))[:height, :width]
        rgb[mask] = colour
    if dense is not None:
        visible = np.kron(dense, np.ones((px, px), bool))
        rgb[visible] = (rgb[visible] * VISIBLE_SHADE).astype(np.uint8)
    img.paste(Image.fromarray(rgb), (margin, margin))
    if min(tile_h, tile_w) >= 4:                      # tile borders, when they do not drown the picture
        for i in range(qt + 1):
            y = margin + min(i * tile_h, height)
            draw.line([(margin, y), (margin + width, y)], fill=(160, 160, 160))
        for j in range(kt + 1):
            x = margin + min(j * tile_w, width)
            draw.line([(x, margin), (x, margin + height)], fill=(160, 160, 160))
    y = margin + height + 8
    x = margin
    counts = tile_counts(classes)
    for c in (FULL, PARTIAL, EMPTY):
        draw.rectangle([x, y, x + 14, y + 14], fill=COLOURS[c], outline=(90, 90, 90))
        label = f"{NAMES[c]} {counts[NAMES[c]]}"
        draw.text((x + 20, y - 1), label, fill="black", font=font)
        x += 34 + int(draw.textlength(label, font=font))
    if dense is not None:
        dark = tuple(int(v * VISIBLE_SHADE) for v in COLOURS[PARTIAL])
        draw.rectangle([x, y, x + 14, y + 14], fill=dark)
        draw.text((x + 20, y - 1), "darker: visible pair", fill="black", font=font)
    if title:
        draw.text((margin, y + 22), title, fill="black", font=font)
    img.save(path, format="PNG")          # whatever the name ends with: --png writes a PNG
