"""Synthetic images where attention has a right answer (issue 40): "what colour is the square?".

Each image is a black canvas cut into a grid of patch cells (32x32 pixels, 8x8 patches: 4x4 cells). One
filled square and 1-3 distractors (a disk, a triangle, a plus) sit each inside its own cell, at a random
offset within it; every object has one of the task's colours, drawn independently (a distractor may share the
square's colour, so "the most common colour" is only a weak cue). The label is the square's colour, so the one
patch that holds the square decides the answer, and its position is known: `decide_mask`.

    images, labels, decide = make_batch(n, seed, image_size=32, patch_size=8)
    images   float32 (n, 3, H, W) in [0, 1]
    labels   int64 (n,)            index into CLASS_NAMES
    decide   bool (n, rows, cols)  True on the patch(es) holding the square

Objects never straddle a cell border, so each object is in exactly one patch and the deciding patches cover
1/(rows·cols) of the image (1/16 at the shipped size). A little uniform pixel noise (standard deviation 0.03,
clipped to [0, 1]) keeps a model from keying on exact values. Everything is drawn from numpy's Generator(seed):
the same seed gives the same bits. `make_batch(..., seed=s)` with s in TRAIN_SEEDS is what training sees; tests
and the shipped checkpoint's held-out accuracy use other seeds (fresh samples).

Also `digits_batch` (optional): scikit-learn's 8x8 handwritten digits (shipped inside the sklearn wheel, so no
download), scaled up to the model's input; only where scikit-learn is installed (`digits_available()`).
"""

from __future__ import annotations

import functools

import numpy as np

CLASS_NAMES = ("red", "green", "blue", "yellow")
COLOURS = np.array([[0.95, 0.15, 0.15], [0.15, 0.85, 0.2], [0.2, 0.35, 1.0], [0.95, 0.9, 0.15]], dtype=np.float32)
SHAPES = ("square", "disk", "triangle", "plus")  # SHAPES[0] is the one asked about
NOISE = 0.03
TASK = "shapes"
QUESTION = "What colour is the square?"
TRAIN_SEEDS = range(0, 10**6)  # training draws batch seeds here; held-out checks use seeds >= 10**6
HELD_OUT_SEED = 10**6 + 7


@functools.lru_cache(maxsize=64)
def shape_mask(shape: str, size: int) -> np.ndarray:
    """(size, size) bool: the filled shape drawn in a size x size box."""
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    c = size / 2
    if shape == "square":
        return np.ones((size, size), dtype=bool)
    if shape == "disk":
        return (x - c) ** 2 + (y - c) ** 2 <= (size / 2) ** 2 * 0.9
    if shape == "triangle":  # apex at the top centre, base along the bottom row
        return np.abs(x - c) <= (y / size) * (size / 2) + 0.25
    if shape == "plus":
        w = max(1, size // 3)
        lo = (size - w) // 2
        m = np.zeros((size, size), dtype=bool)
        m[lo:lo + w, :] = True
        m[:, lo:lo + w] = True
        return m
    raise ValueError(f"unknown shape {shape!r}; shapes are {SHAPES}")


def grid_of(image_size: int, patch_size: int) -> tuple[int, int]:
    if image_size <= 0 or patch_size <= 0 or image_size % patch_size:
        raise ValueError(f"image_size ({image_size}) must be a positive multiple of patch_size ({patch_size})")
    g = image_size // patch_size
    return g, g


@functools.lru_cache(maxsize=8)
def _placed(patch_size: int, lo_size: int) -> np.ndarray:
    """(shapes, sizes, oy, ox, p, p) bool: every shape of every size lo_size..p at every offset inside a p x p cell
    (offsets past p - size are left empty and never drawn)."""
    p = patch_size
    table = np.zeros((len(SHAPES), p - lo_size + 1, p, p, p, p), dtype=bool)
    for s, shape in enumerate(SHAPES):
        for z, size in enumerate(range(lo_size, p + 1)):
            m = shape_mask(shape, size)
            for oy in range(p - size + 1):
                for ox in range(p - size + 1):
                    table[s, z, oy, ox, oy:oy + size, ox:ox + size] = m
    return table


def make_batch(n: int, seed: int, image_size: int = 32, patch_size: int = 8, n_distractors: tuple[int, int] = (1, 3),
               noise: float = NOISE) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n images of the task (see the module docstring): (images (n, 3, H, W) float32 in [0, 1], labels (n,) int64,
    decide_mask (n, rows, cols) bool). Drawn as whole arrays (no loop over images): 0.1 ms an image."""
    rows, cols = grid_of(image_size, patch_size)
    p, N = patch_size, rows * cols
    lo_d, hi_d = n_distractors
    K = 1 + hi_d  # object slots; slot 0 is the square
    if N < K:
        raise ValueError(f"a {rows}x{cols} grid has no room for a square and {hi_d} distractors")
    lo_size = max(3, (3 * p) // 4)  # 6..8 px in an 8 px cell: big enough to tell a square from a disk
    rng = np.random.default_rng(seed)
    k = 1 + rng.integers(lo_d, hi_d + 1, size=n)  # objects in each image
    cells = np.argsort(rng.random((n, N)), axis=1)[:, :K]  # K distinct cells per image
    colours = rng.integers(0, len(CLASS_NAMES), size=(n, K))
    kinds = rng.integers(1, len(SHAPES), size=(n, K))
    kinds[:, 0] = 0
    sizes = rng.integers(lo_size, p + 1, size=(n, K))
    offs = np.floor(rng.random((n, K, 2)) * (p - sizes + 1)[..., None]).astype(np.int64)
    masks = _placed(p, lo_size)[kinds, sizes - lo_size, offs[..., 0], offs[..., 1]]  # (n, K, p, p)
    present = np.arange(K)[None] < k[:, None]  # (n, K)
    obj = (masks[:, :, None] * present[..., None, None, None]) * COLOURS[colours][..., None, None]  # (n, K, 3, p, p)
    cell_img = np.zeros((n, N, 3, p, p), dtype=np.float32)
    cell_img[np.arange(n)[:, None], cells] = obj
    images = cell_img.reshape(n, rows, cols, 3, p, p).transpose(0, 3, 1, 4, 2, 5).reshape(n, 3, image_size,
                                                                                        image_size)
    images = np.ascontiguousarray(images)
    decide = np.zeros((n, N), dtype=bool)
    decide[np.arange(n), cells[:, 0]] = True
    if noise:
        half = np.float32(noise * 3 ** 0.5)  # uniform on [-half, half]: standard deviation `noise`, 4x cheaper to draw
        images += (rng.random(images.shape, dtype=np.float32) * 2 - 1) * half
        np.clip(images, 0.0, 1.0, out=images)
    return images, colours[:, 0].astype(np.int64), decide.reshape(n, rows, cols)


# ---------------------------------------------------------------------- scikit-learn's digits (optional)

DIGIT_NAMES = tuple(str(d) for d in range(10))


def digits_available() -> bool:
    try:
        import sklearn.datasets  # noqa: F401
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # the 1,797 images ship inside the wheel: no download

    d = load_digits()
    return (d.images / 16.0).astype(np.float32), d.target.astype(np.int64)


def digits_split(split: str) -> np.ndarray:
    """Indices of a fixed split of the 1,797 digits: "train" (the first 80% of a seeded shuffle) or "test"."""
    _, y = _digits()
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(0.8 * len(y))
    return order[:cut] if split == "train" else order[cut:]


def digits_batch(n: int, seed: int, image_size: int = 32, patch_size: int = 8, split: str = "train"
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n digits of `split` drawn with `seed`, white on black, each 8x8 pixel scaled up to image_size (nearest), as
    grey RGB: (images (n, 3, H, W), labels (n,), decide_mask all False: no patch is known to decide a digit)."""
    if not digits_available():
        raise ValueError("the digits need scikit-learn (pip install scikit-learn): its 8x8 digits ship in the wheel")
    rows, cols = grid_of(image_size, patch_size)
    x, y = _digits()
    idx = digits_split(split)
    pick = idx[np.random.default_rng(seed).integers(0, len(idx), size=n)]
    f = image_size // 8
    if image_size % 8:
        raise ValueError(f"digits need image_size a multiple of 8, got {image_size}")
    big = np.repeat(np.repeat(x[pick], f, axis=1), f, axis=2)  # (n, H, W)
    images = np.repeat(big[:, None], 3, axis=1).astype(np.float32)
    return images, y[pick], np.zeros((n, rows, cols), dtype=bool)


def digits_test(image_size: int = 32, patch_size: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The whole test split (360 digits, in split order), as digits_batch gives them: the held-out set."""
    x, y = _digits()
    idx = digits_split("test")
    f = image_size // 8
    big = np.repeat(np.repeat(x[idx], f, axis=1), f, axis=2)
    rows, cols = grid_of(image_size, patch_size)
    return np.repeat(big[:, None], 3, axis=1).astype(np.float32), y[idx], np.zeros((len(idx), rows, cols), bool)


TASKS = {"shapes": (CLASS_NAMES, QUESTION), "digits": (DIGIT_NAMES, "Which digit is this?")}


def batch(task: str, n: int, seed: int, image_size: int = 32, patch_size: int = 8, split: str = "train"):
    """make_batch or digits_batch by task name."""
    if task == "shapes":
        return make_batch(n, seed, image_size, patch_size)
    if task == "digits":
        return digits_batch(n, seed, image_size, patch_size, split)
    raise ValueError(f"unknown vision task {task!r}; tasks are {sorted(TASKS)}")
