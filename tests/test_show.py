"""Pictures: the text grid's cells are the tiles' classes, downsampling is sound, the PNG is drawn."""
from pathlib import Path

import numpy as np
import pytest

import maskc
from maskc.kernel_ir import EMPTY, FULL, PARTIAL
from maskc.show import GLYPHS, downsample, render_dense, render_png, render_tiles, tile_counts

EXAMPLES = Path(__file__).parent.parent / "examples"


def _grid(text: str) -> list[str]:
    """The rows inside the picture's box."""
    return [line[1:-1] for line in text.splitlines() if line.startswith("│")]


def _glyph_counts(rows: list[str]) -> dict[str, int]:
    joined = "".join(rows)
    return {"FULL": joined.count(GLYPHS[FULL]), "PARTIAL": joined.count(GLYPHS[PARTIAL]),
            "EMPTY": joined.count(GLYPHS[EMPTY])}


@pytest.mark.parametrize("mask,params,block", [
    ("document.mask", {"docs": [100, 200, 724]}, (128, 128)),
    ("sliding_window.mask", {"window": 200}, (64, 32)),
    ("clear.mask", {"text": 64, "width": 32, "radius": 4}, (128, 64)),
])
def test_cells_match_tile_classes(mask, params, block):
    bound = maskc.load(EXAMPLES / mask).bind(seq_len=1024, **params)
    classes = bound.tiles(*block)
    text = render_tiles(classes, *block)
    rows = _grid(text)
    assert "scale" not in text
    assert len(rows) == classes.shape[0] and all(len(r) == classes.shape[1] for r in rows)
    assert _glyph_counts(rows) == tile_counts(classes)
    # cell by cell, not only in total
    decoded = np.array([[{v: k for k, v in GLYPHS.items()}[ch] for ch in r] for r in rows])
    assert (decoded == classes).all()
    counts = tile_counts(classes)
    assert f"FULL {counts['FULL']}" in text and f"EMPTY {counts['EMPTY']}" in text


def test_large_grids_are_downsampled_to_80_columns_with_scale_stated():
    bound = maskc.load(EXAMPLES / "document.mask").bind(seq_len=32768, docs=[10000, 20000, 2768])
    classes = bound.tiles(128, 128)
    text = render_tiles(classes, 128, 128)
    assert "scale: 1 cell = 4x4 tiles" in text
    assert max(len(line) for line in text.splitlines() if line.startswith(("│", "┌"))) <= 80
    # the legend still counts the real tiles
    counts = tile_counts(classes)
    assert f"FULL {counts['FULL']}   ▒ PARTIAL {counts['PARTIAL']}" in text


def test_downsample_keeps_full_and_empty_only_when_unanimous():
    classes = np.array([[FULL, FULL, EMPTY], [FULL, FULL, EMPTY], [FULL, PARTIAL, EMPTY]], np.int8)
    assert downsample(classes, 2).tolist() == [[FULL, EMPTY], [PARTIAL, EMPTY]]
    assert downsample(classes, 1) is classes


def test_dense_picture_is_the_mask():
    bound = maskc.load(EXAMPLES / "causal.mask").bind(seq_len=5)
    rows = _grid(render_dense(bound.dense()))
    assert rows == ["█····", "██···", "███··", "████·", "█████"]


@pytest.mark.parametrize("with_dense", [False, True])
def test_png_is_written_with_tile_colours(tmp_path, with_dense):
    from PIL import Image

    from maskc.show import COLOURS
    bound = maskc.load(EXAMPLES / "prefix_lm.mask").bind(seq_len=64, prefix=10)
    classes = bound.tiles(16, 16)
    out = tmp_path / "m.png"
    render_png(classes, str(out), 16, 16, dense=bound.dense() if with_dense else None, title="prefix_lm")
    img = np.asarray(Image.open(out).convert("RGB"))
    assert img.shape[0] > 100 and img.shape[1] > 100
    colours = {tuple(c) for c in img.reshape(-1, 3)}
    assert COLOURS[EMPTY] in colours and COLOURS[PARTIAL] in colours   # tiles and legend swatches
