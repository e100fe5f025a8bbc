"""Tiles computed per visible pair for 2-D and 3-D masks in raster order and in patch orders (a measurement with
numpy alone, independent of maskc: issue 15 item 2's prediction is written from it).

    python bench/patch_density.py [--masks clear,neighborhood,video] [--tiles 128x128,128x64,64x128]

A token order is a permutation of the positions: ``perm[i]`` is the raster position of the i-th token in the
order. The kernel walks tiles of ``block_m`` consecutive queries by ``block_n`` consecutive keys *in that order*;
a tile is FULL when every pair in it is visible, PARTIAL when some are, EMPTY otherwise, and the kernel computes
FULL and PARTIAL tiles whole. For every mask, order and tile shape this prints the tiles of each class, the
pairs computed (tiles x block_m x block_n) per visible pair, and the tile work against raster's with a PARTIAL
tile weighed ``--partial-cost`` FULL ones (default 2.6: clear's forward in run 38, bench/NOTES.md).

Orders (``W`` the image's width, ``T`` its first position; positions outside the whole bands stay in place):

- ``raster``: the identity;
- ``bands<ph>``: the image cut in bands of ``ph`` rows, each band column by column (a column's ``ph`` tokens
  together): a tile of ``b`` tokens is a patch of ``ph`` rows by ``b / ph`` columns, whatever the width;
- ``patch<ph>x<pw>``: row-major patches of ``ph`` x ``pw`` (``pw`` dividing W), patch after patch along a band;
- video only: ``bands<ph>`` within each frame, and ``bricks<pt>x<ph>``: groups of ``pt`` frames, each group cut
  in bands of ``ph`` rows, column by column, a column's ``pt`` x ``ph`` tokens together.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np


# ---- the masks, on raster positions (int64 arrays broadcast against each other) ----------------------------

@dataclass(frozen=True)
class Clear:
    """examples/clear.mask: text, then an image `width` wide; a token sees image tokens within `radius`."""
    seq_len: int = 32768
    text: int = 512
    width: int = 128
    radius: int = 16
    name: str = "clear"

    @property
    def grid(self):
        return self.text, (self.width,), self.seq_len - self.text

    def visible(self, q, k):
        T, W, R = self.text, self.width, self.radius
        dy = (q - T) // W - (k - T) // W
        dx = (q - T) % W - (k - T) % W
        return (q < T) | (k < T) | (dy * dy + dx * dx < R * R)

    def candidates(self, q):
        """Raster keys that may be visible to some query of ``q`` (a superset)."""
        T, W, R, S = self.text, self.width, self.radius, self.seq_len
        if q.min() < T:
            return np.arange(S)
        y = (q - T) // W
        lo, hi = T + max(0, y.min() - R) * W, min(S, T + (y.max() + R + 1) * W)
        return np.concatenate([np.arange(T), np.arange(lo, hi)])


@dataclass(frozen=True)
class Neighborhood:
    """examples/neighborhood.mask: a window x window block, clamped inside the image (NATTEN)."""
    seq_len: int = 181 * 181
    width: int = 181
    window: int = 13
    name: str = "neighborhood"

    @property
    def grid(self):
        return 0, (self.width,), self.seq_len

    def visible(self, q, k):
        W, w = self.width, self.window
        height = -(-self.seq_len // W)
        y0 = np.clip(q // W - w // 2, 0, height - w)
        x0 = np.clip(q % W - w // 2, 0, W - w)
        return (k // W >= y0) & (k // W < y0 + w) & (k % W >= x0) & (k % W < x0 + w)

    def candidates(self, q):
        W, w, S = self.width, self.window, self.seq_len
        y = q // W
        return np.arange(max(0, (y.min() - w) * W), min(S, (y.max() + w + 1) * W))


@dataclass(frozen=True)
class Video:
    """examples/video.mask: frames of height x width; a token sees its frame and `past` frames before, within
    `radius` rows and columns (bench/workloads.py's shape: 32 x 32 frames, radius 4, one frame back)."""
    seq_len: int = 32768
    width: int = 32
    height: int = 32
    radius: int = 4
    past: int = 1
    name: str = "video"

    @property
    def grid(self):
        return 0, (self.width, self.height), self.seq_len

    def visible(self, q, k):
        W, H, r, p = self.width, self.height, self.radius, self.past
        tq, tk = q // (W * H), k // (W * H)
        dy, dx = (q // W) % H - (k // W) % H, q % W - k % W
        return (tk <= tq) & (tk >= tq - p) & (np.abs(dy) <= r) & (np.abs(dx) <= r)

    def candidates(self, q):
        W, H, p, S = self.width, self.height, self.past, self.seq_len
        t = q // (W * H)
        return np.arange(max(0, (t.min() - p) * W * H), min(S, (t.max() + 1) * W * H))


MASKS = {"clear": Clear, "neighborhood": Neighborhood, "video": Video}


# ---- token orders: perm[i] = the raster position of the i-th token ----------------------------------------

def raster(n: int, grid) -> np.ndarray:
    return np.arange(n)


def bands(ph: int):
    def order(n, grid):
        T, dims, count = grid
        W = dims[0]
        perm = np.arange(n)
        if len(dims) == 1:                         # one image: whole bands of ph rows, the rest in place
            full = count // (ph * W) * (ph * W)
            u = np.arange(full)
            perm[T:T + full] = T + W * (ph * (u // (ph * W)) + u % ph) + (u // ph) % W
            return perm
        H = dims[1]                                 # frames: bands within each frame (ph divides H)
        if H % ph:
            return None
        full = count // (W * H) * (W * H)
        u = np.arange(full)
        frame, v = u // (W * H), u % (W * H)
        perm[T:T + full] = T + W * H * frame + W * (ph * (v // (ph * W)) + v % ph) + (v // ph) % W
        return perm
    order.__name__ = f"bands{ph}"
    return order


def patch(ph: int, pw: int):
    def order(n, grid):
        T, dims, count = grid
        W = dims[0]
        if len(dims) != 1 or W % pw:
            return None
        perm = np.arange(n)
        full = count // (ph * W) * (ph * W)
        u = np.arange(full)
        band, o = u // (ph * W), u % (ph * W)
        col, r = o // (ph * pw), o % (ph * pw)
        perm[T:T + full] = T + W * (ph * band + r // pw) + pw * col + r % pw
        return perm
    order.__name__ = f"patch{ph}x{pw}"
    return order


def bricks(pt: int, ph: int):
    def order(n, grid):
        T, dims, count = grid
        if len(dims) != 2 or dims[1] % ph:
            return None
        W, H = dims
        perm = np.arange(n)
        group = pt * H * W
        full = count // group * group
        u = np.arange(full)
        g, v = u // group, u % group
        band, w = v // (pt * ph * W), v % (pt * ph * W)
        x, dt, dy = w // (pt * ph), (w % (pt * ph)) // ph, w % ph
        perm[T:T + full] = T + W * H * (pt * g + dt) + W * (ph * band + dy) + x
        return perm
    order.__name__ = f"bricks{pt}x{ph}"
    return order


ORDERS = {
    "clear": [raster, bands(4), bands(8), bands(16), bands(32), patch(8, 16), patch(16, 8), patch(4, 32),
              patch(8, 8)],
    "neighborhood": [raster, bands(4), bands(8), bands(16), bands(32)],
    "video": [raster, bands(4), bands(8), bands(16), bricks(2, 4), bricks(2, 8), bricks(2, 2)],
}


# ---- counting -----------------------------------------------------------------------------------------------

def count_tiles(mask, perm: np.ndarray, block_m: int, block_n: int) -> dict:
    """FULL and PARTIAL tiles and visible pairs of ``mask`` with tokens in the order ``perm``."""
    n = mask.seq_len
    assert np.array_equal(np.sort(perm), np.arange(n)), "not a permutation"
    where = np.empty(n, np.int64)
    where[perm] = np.arange(n)                       # raster position -> index in the order
    n_kv = -(-n // block_n)
    kv_size = np.minimum(block_n, n - block_n * np.arange(n_kv))
    full = partial = visible = 0
    for start in range(0, n, block_m):
        q = perm[start:start + block_m]
        keys = mask.candidates(q)
        vis = mask.visible(q[:, None], keys[None, :])
        per_key = vis.sum(0)
        tiles = np.bincount(where[keys] // block_n, weights=per_key, minlength=n_kv).astype(np.int64)
        visible += int(per_key.sum())
        full += int((tiles == len(q) * kv_size).sum())
        partial += int(((tiles > 0) & (tiles < len(q) * kv_size)).sum())
    return {"full": full, "partial": partial, "visible": visible}


def check_candidates(mask) -> None:
    """The candidate sets hold every visible key (brute force on a small instance of the same mask)."""
    small = {"clear": Clear(seq_len=1500, text=100, width=40, radius=7),
             "neighborhood": Neighborhood(seq_len=40 * 37 + 11, width=40, window=7),
             "video": Video(seq_len=5 * 12 * 10 + 37, width=12, height=10, radius=2, past=1)}[mask.name]
    keys = np.arange(small.seq_len)
    for start in range(0, small.seq_len, 64):
        q = np.arange(start, min(small.seq_len, start + 64))
        vis = small.visible(q[:, None], keys[None, :])
        outside = np.setdiff1d(keys, small.candidates(q))
        assert not vis[:, outside].any(), f"{mask.name}: a visible key outside the candidates"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--masks", default="clear,neighborhood,video")
    ap.add_argument("--tiles", default="128x128,128x64,64x128")
    ap.add_argument("--partial-cost", type=float, default=2.6, help="a PARTIAL tile's time in FULL tiles")
    args = ap.parse_args()
    shapes = [tuple(map(int, t.split("x"))) for t in args.tiles.split(",")]
    for name in args.masks.split(","):
        mask = MASKS[name]()
        check_candidates(mask)
        print(f"\n## {name}: {mask}")
        print("| order | tiles | FULL | PARTIAL | computed / visible | visible share | vs raster (pairs) "
              f"| vs raster (work, PARTIAL = {args.partial_cost} FULL) |")
        print("|---|---|---|---|---|---|---|---|")
        for bm, bn in shapes:
            base = base_work = None
            for order in ORDERS[name]:
                perm = order(mask.seq_len, mask.grid)
                if perm is None:
                    continue
                c = count_tiles(mask, perm, bm, bn)
                computed = (c["full"] + c["partial"]) * bm * bn
                work = c["full"] + args.partial_cost * c["partial"]
                base, base_work = base or computed, base_work or work
                print(f"| {order.__name__} | {bm}x{bn} | {c['full']} | {c['partial']} | "
                      f"{computed / c['visible']:.2f} | {c['visible'] / computed:.1%} | {base / computed:.2f}x | "
                      f"{base_work / work:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
