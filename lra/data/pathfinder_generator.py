"""Pathfinder and Path-X images (Linsley et al., 2018), generated as the Long Range Arena did.

Papers: D. Linsley, J. Kim, V. Veerabadran, C. Windolf, T. Serre, "Learning long-range spatial
dependencies with horizontal gated recurrent units", NeurIPS 2018 (the Pathfinder challenge);
J. Kim*, D. Linsley* et al., "Disentangling neural mechanisms for perceptual grouping", ICLR 2020
(the generator as released); Y. Tay et al., "Long Range Arena", ICLR 2021 (Pathfinder = 32x32,
Path-X = 128x128, both at the "hard" level, contour length 14). The public generator is
github.com/drewlinsley/pathfinder (``snakes2.py``, ``snakes.py``, ``snakes2_wrapper.py``; Python
2.7, MIT). This module re-implements its algorithm; no code is taken from it.

An image shows two target "snakes", shorter distractor snakes and two round markers. The label is
1 when both markers sit on the two ends of one target snake, 0 when they sit on ends of different
target snakes. The algorithm, as implemented here:

1. Draw the label uniformly from {0, 1} and the paddle margin ``m`` from ``paddle_margins``.
2. A snake is a chain of "paddles": straight strokes of ``paddle_length`` pixels and
   ``paddle_thickness``, anchored on whole pixels. Each paddle is drawn with PIL in a small patch at
   ``antialias_scale`` times the resolution, Lanczos-downsampled to the image resolution in 8 bits
   (as ``scipy.misc.imresize`` did), scaled by its contrast and max-combined into a float image.
   Its *footprint* (the stroke dilated by a disk of radius ``m`` at the antialias scale, downsampled
   the same way, so soft-edged) is max-combined into an occupancy mask that starts with a
   ``padding``-pixel frame of ones.
3. Target snakes (the original's ``two_snakes``). Snake 0's first paddle gets a uniform orientation
   in whole degrees and a tail drawn uniformly among the pixels where the footprint's saturated core
   lands only on pixels of occupancy <= 0.3, with a ``2 * seed_distance`` frame counted as occupied
   too (so it starts near the centre). Snake 1's first paddle starts ``seed_distance`` from snake 0's
   tail in a uniform direction. Then ``contour_length - 1`` times, each snake in turn grows by one
   paddle: the next *pivot* lies ``paddle_length + 2 m`` beyond the previous one along the previous
   paddle (a straight snake has paddles of ``paddle_length`` separated by gaps of ``2 m``); the
   candidate ends are the pixels on the circle of radius ``paddle_length + m`` around the pivot,
   weighted by ``cos(min(|turn| * continuity, pi / 2))**2`` times ``1 - occupancy`` dilated by a disk
   of radius ``m``; a drawn candidate becomes a paddle from that end back towards the pivot unless
   ``max(occupancy + footprint) >= 1.8`` (up to ``max_paddle_retries + 1`` draws). A snake's own
   newest paddle is left out of the occupancy it is tested against (its successor necessarily comes
   within ``2 m`` of it) and committed once the successor is placed. If either snake cannot grow,
   both are drawn again from scratch. Snakes are long for the image (14 paddles of period 4 px in
   32 px, of 9-11 px in 128 px), so most attempts fail against the border or the other snake:
   about 1 attempt in 21 succeeds at 32 px, about 1 in 70 (m = 2) or 1 in 560 (m = 3) at 128 px
   (the mean ``Sample.attempts`` of ``generate_sample(PathfinderConfig.lra(resolution), 0, index)``
   over indices 0-999 at 32 px, 0-199 at 128 px: 21.4, 73.3 and 561; commit 102e79e, 2026-11-28);
   the images are those that fit.
4. Distractors (``make_many_snakes``): ``num_distractor_snakes`` snakes of ``distractor_length``
   paddles, each seeded uniformly in the remaining free space (none once fewer than 1% of the
   pixels are free) and grown the same way; a snake that fails is retried
   ``max_distractor_retries`` times and then dropped. As in the original, a distractor paddle's
   contrast is drawn from ``snake_contrasts`` alone while a target paddle's is
   ``paddle_contrast * snake_contrast`` (at 32 px distractors are 2.0, targets 1.5). Single-paddle
   clutter (``use_single_paddles``) uses the original's count formula; it is off, as in
   ``snakes2_wrapper.py``.
5. Markers: one target is chosen at random as snake A, the other is B. Filled circles of
   ``marker_radius``, drawn at the antialias scale and Lanczos-downsampled (values 0..1), go on
   A's start tip and on the end tip of A (label 1) or of B (label 0), max-combined into the image.
6. The float image is byte-scaled like ``scipy.misc.imsave`` (``bytescale``):
   ``(x - min) / (max - min) * 255 + 0.5``, clipped, cast to uint8. The minimum is the background's
   0, so the background is exactly 0 and the brightest pixel is 255 (at 32 px the brightest pixels
   are distractor strokes, so markers come out at about 221 and target strokes lower).

At 32 px a footprint is saturated only on the stroke itself, so two paddles may cross diagonally
(the footprint sum stays below 1.8 between pixels): the original's rule allows such X crossings,
between distractors and targets and between the two targets too, and so does this module.
Sample.footprints exposes both targets' footprints so that tests can check the rule.

LRA's parameters (:meth:`PathfinderConfig.lra`, from the docstrings of ``Pathfinder32`` and
``Pathfinder128`` in ``lra_benchmarks/data/pathfinder.py``; anything not listed there is the
original ``Args`` default, and ``/`` was Python 2 integer division):

============================  ==================  ===================
parameter                     32 (Pathfinder)     128 (Path-X)
============================  ==================  ===================
padding, antialias_scale      1, 2                1, 2
paddle_length                 2                   5 (default)
paddle_thickness              0.5                 1.5
paddle_margins                (1,)                (2, 3)
marker_radius                 1.5                 3
seed_distance                 7                   20
continuity                    1.0                 1.8
contour_length                14                  14
distractor_length             14 // 3 = 4         14 // 3 = 4
num_distractor_snakes         20 // 4 = 5         35 // 4 = 8
snake_contrasts               (2,)                (0.9,)
paddle_contrasts              (0.75,)             (1.0,) (default)
retries (paddle, distractor)  2, 4 (default)      2, 4 (default)
============================  ==================  ===================

Deliberate deviations from the original:

* Randomness: one numpy Generator per image from ``SeedSequence([seed, index])`` instead of the
  unseeded global ``np.random``/``random``: an image depends only on (config, seed, index), never
  on the worker count, and a dataset is reproducible.
* Target separation (``separate_targets=True``, the default): a target paddle is also tested
  against the other target's newest paddle, and both targets' last paddles are committed before
  the distractors. The original's alternating growth lags by one paddle, so the two targets may
  come within collision distance at the step where both grow (in about 30% of its accepted
  target pairs at 32 px), and distractors may overlap snake 0's last paddle; touching targets
  blur the label. ``separate_targets=False`` restores the original's behaviour.
* Coordinates are rounded to the nearest pixel; the original takes ``ceil`` of pivots and
  truncates candidate ends, shifting each step by half a pixel towards +y/+x or -y/-x. Markers are
  centred on the tip pixel; the original's circle sits a quarter pixel up and left of it.
* The seeding test places the paddle's footprint core at the tail itself, and pixels outside the
  image count as occupied; the original's structuring element is cropped and off by one pixel
  diagonally, and the outside of the image is not checked.
* A target paddle's contrast is drawn per paddle (the original shares one draw between the two
  targets at each step); with LRA's one-element contrast lists the images are the same.
* Target growth gives up with an error after ``max_image_retries`` attempts (the original loops
  forever); the default cap is far above what LRA's parameters need.
* Output: metadata are written as the text the LRA release and every loader use, not with
  ``np.save`` as the public script does; images are mode "L" PNGs written with PIL after the
  ``imsave``-style byte scaling.

Layout written by :func:`generate` (the official one): ``imgs/<k>/sample_<i>.png`` and
``metadata/<k>.npy`` with ``images_per_folder`` images per folder ``k``. As in the original (one
batch per folder), ``i`` restarts at 0 in every folder; the image of global index
``g = k * images_per_folder + i`` is ``generate_sample(config, seed, g)``. Metadata fields, as
``str`` of the original's values: ``imgs/<k> sample_<i>.png <i> <label> <continuity>
<contour_length> <distractor_length> <paddle_length> <paddle_thickness> <paddle_margin>
<number of paddle contrasts>``, e.g. ``imgs/0 sample_0.png 0 1 1.0 14 4 2 0.5 1 1``. A
``generator.json`` records the parameters and the files (:mod:`lra.data.records`: per ``imgs/<k>/`` folder its
image count, bytes and SHA-256), which :func:`ensure_generated` checks before every use.

Speed on this repository's 2-core machine: about 90 images per CPU-second at 32 px (175 images/s
with 2 workers: 200,000 in about 20 minutes) and about 4 at 128 px (200,000 in about 7 hours), nearly
all of it spent in the rejected target attempts of step 3.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import multiprocessing
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw
from tqdm import tqdm

from . import records
from .staging import folder_lock, staged_folder

log = logging.getLogger(__name__)

#: Bumped whenever the images a configuration produces change; part of every cache folder's name.
GENERATOR_VERSION = 1
GENERATOR_JSON = "generator.json"

# The original's thresholds on the soft (Lanczos-downsampled) occupancy mask.
SEED_FREE_BELOW = 0.3  # a seed's footprint core may only land on pixels at most this occupied
COLLISION_SUM = 1.8  # a paddle is rejected where occupancy + its footprint reach this
# Footprints are multiples of 1/255, so sums are too: compare with a tolerance far below 1/255
# so that a sum of exactly 1.8 counts as reaching it whatever the float rounding.
TOLERANCE = 1e-4
MIN_FREE_FRACTION = 0.01  # distractors stop seeding once fewer pixels than this are free


# --------------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class PathfinderConfig:
    """The generator's parameters; the defaults are LRA's Pathfinder (32x32, contour length 14)."""

    resolution: int = 32
    padding: int = 1
    paddle_length: int = 2
    paddle_thickness: float = 0.5
    paddle_margins: tuple[int, ...] = (1,)  # one is drawn per image
    marker_radius: float = 1.5
    antialias_scale: int = 2
    seed_distance: int = 7
    continuity: float = 1.0
    contour_length: int = 14
    distractor_length: int = 4
    num_distractor_snakes: int = 5
    snake_contrasts: tuple[float, ...] = (2.0,)  # one per target snake; distractor paddles' contrast
    paddle_contrasts: tuple[float, ...] = (0.75,)  # one per target paddle, times its snake's
    use_single_paddles: bool = False
    separate_targets: bool = True  # False: the original's one-paddle lag (see the module docstring)
    max_paddle_retries: int = 2
    max_distractor_retries: int = 4
    max_image_retries: int = 100_000

    def __post_init__(self) -> None:
        # Normalise types (lists from YAML/JSON become tuples, ints become floats) so that equal
        # configurations compare, hash and print (metadata, folder names) the same.
        try:
            object.__setattr__(self, "paddle_margins", tuple(self.paddle_margins))
            for name in ("snake_contrasts", "paddle_contrasts"):
                object.__setattr__(self, name, tuple(float(c) for c in getattr(self, name)))
            for name in ("paddle_thickness", "marker_radius", "continuity"):
                object.__setattr__(self, name, float(getattr(self, name)))
        except (TypeError, ValueError) as error:
            raise ValueError(f"PathfinderConfig: a parameter has the wrong type ({error}): {self}") from None
        self._validate()

    def _validate(self) -> None:
        def need(condition: bool, message: str) -> None:
            if not condition:
                raise ValueError(f"PathfinderConfig: {message}")

        integers = (
            "resolution",
            "padding",
            "paddle_length",
            "antialias_scale",
            "seed_distance",
            "contour_length",
            "distractor_length",
            "num_distractor_snakes",
            "max_paddle_retries",
            "max_distractor_retries",
            "max_image_retries",
        )
        for name in integers:
            value = getattr(self, name)
            need(
                isinstance(value, (int, np.integer)) and not isinstance(value, bool), f"{name} must be an integer, got {value!r}"
            )
        need(self.resolution >= 8, f"resolution must be >= 8, got {self.resolution}")
        need(0 <= self.padding < self.resolution // 4, f"padding must be in [0, resolution/4), got {self.padding}")
        need(self.paddle_length >= 1, f"paddle_length must be >= 1, got {self.paddle_length}")
        need(self.antialias_scale >= 1, f"antialias_scale must be >= 1, got {self.antialias_scale}")
        blown = self.paddle_thickness * self.antialias_scale
        need(
            self.paddle_thickness > 0 and blown == round(blown),
            f"paddle_thickness * antialias_scale must be a positive integer (the stroke width in "
            f"antialiased pixels), got {self.paddle_thickness} * {self.antialias_scale}",
        )
        need(len(self.paddle_margins) > 0, "paddle_margins must not be empty")
        for margin in self.paddle_margins:
            need(
                isinstance(margin, (int, np.integer)) and not isinstance(margin, bool) and margin >= 0,
                f"paddle_margins must be integers >= 0, got {self.paddle_margins}",
            )
        need(self.marker_radius > 0, f"marker_radius must be > 0, got {self.marker_radius}")
        need(self.seed_distance >= 1, f"seed_distance must be >= 1, got {self.seed_distance}")
        need(
            4 * self.seed_distance < self.resolution,
            f"4 * seed_distance must be < resolution (the first target starts inside a frame of "
            f"2 * seed_distance), got seed_distance={self.seed_distance}, resolution={self.resolution}",
        )
        need(self.continuity >= 0, f"continuity must be >= 0, got {self.continuity}")
        need(self.contour_length >= 1, f"contour_length must be >= 1, got {self.contour_length}")
        need(self.num_distractor_snakes >= 0, f"num_distractor_snakes must be >= 0, got {self.num_distractor_snakes}")
        need(
            self.distractor_length >= 1 or self.num_distractor_snakes == 0,
            f"distractor_length must be >= 1 when there are distractors, got {self.distractor_length}",
        )
        for name in ("snake_contrasts", "paddle_contrasts"):
            values = getattr(self, name)
            need(len(values) > 0 and all(c > 0 for c in values), f"{name} must be non-empty and positive, got {values}")
        need(
            self.max_paddle_retries >= 0 and self.max_distractor_retries >= 0,
            "max_paddle_retries and max_distractor_retries must be >= 0",
        )
        need(self.max_image_retries >= 1, f"max_image_retries must be >= 1, got {self.max_image_retries}")

    @classmethod
    def lra(cls, resolution: int = 32, contour_length: int = 14) -> PathfinderConfig:
        """LRA's settings: resolution 32 is Pathfinder, 128 is Path-X; contour length 14 is "hard"."""
        if contour_length < 3:
            raise ValueError(f"contour_length must be >= 3 (distractor_length = contour_length // 3), got {contour_length}")
        distractor_length = contour_length // 3
        if resolution == 32:
            return cls(
                resolution=32,
                padding=1,
                paddle_length=2,
                paddle_thickness=0.5,
                paddle_margins=(1,),
                marker_radius=1.5,
                antialias_scale=2,
                seed_distance=7,
                continuity=1.0,
                contour_length=contour_length,
                distractor_length=distractor_length,
                num_distractor_snakes=20 // distractor_length,
                snake_contrasts=(2.0,),
                paddle_contrasts=(0.75,),
            )
        if resolution == 128:
            return cls(
                resolution=128,
                padding=1,
                paddle_length=5,
                paddle_thickness=1.5,
                paddle_margins=(2, 3),
                marker_radius=3.0,
                antialias_scale=2,
                seed_distance=20,
                continuity=1.8,
                contour_length=contour_length,
                distractor_length=distractor_length,
                num_distractor_snakes=35 // distractor_length,
                snake_contrasts=(0.9,),
                paddle_contrasts=(1.0,),
            )
        raise ValueError(f"LRA's Pathfinder settings exist for resolution 32 (Pathfinder) and 128 (Path-X), got {resolution}")


# --------------------------------------------------------------------------------------------------
# Results


@dataclass(frozen=True)
class Snake:
    """One snake's paddles in growth order, in pixel coordinates (row, column) of the image.

    Paddle ``k`` is the stroke from ``near[k]`` (the end facing paddle ``k - 1``) to ``far[k]``.
    """

    near: np.ndarray  # (num_paddles, 2) float64
    far: np.ndarray  # (num_paddles, 2) float64

    @property
    def centers(self) -> np.ndarray:  # (num_paddles, 2)
        return (self.near + self.far) / 2

    @property
    def start_tip(self) -> np.ndarray:  # (2,)
        return self.near[0]

    @property
    def end_tip(self) -> np.ndarray:  # (2,)
        return self.far[-1]


@dataclass
class Sample:
    """One generated image and the geometry it was drawn from."""

    image: np.ndarray  # (resolution, resolution) uint8, background 0
    label: int  # 1: both markers on snake A; 0: one on A, one on B
    margin: int  # the paddle margin drawn for this image
    snake_a: Snake  # the target snake carrying the first marker at its start tip
    snake_b: Snake  # the other target snake
    distractors: list[Snake] = field(default_factory=list)
    markers: np.ndarray = field(default_factory=lambda: np.zeros((2, 2)))  # (2, 2): A's start, the end tip
    # (2, H, W) float32: A's and B's footprints (strokes dilated by the margin, soft, as in the
    # occupancy test); the generator keeps their sum below COLLISION_SUM - TOLERANCE everywhere.
    footprints: np.ndarray | None = None
    attempts: int = 1  # whole-image attempts the target snakes needed


# --------------------------------------------------------------------------------------------------
# Paddle stamps: one paddle rendered in a small patch whose centre pixel is its anchor


@dataclass(frozen=True)
class _Stamp:
    stroke: np.ndarray  # (S, S) float32 in [0, 1], S = 2 * half + 1
    footprint: np.ndarray  # (S, S) float32 in [0, 1]: the stroke dilated by the margin
    core: np.ndarray  # (k, 2) int offsets from the anchor where the footprint is saturated
    tip: np.ndarray  # (2,) float: the stroke's other end relative to the anchor, image pixels
    half: int


@functools.lru_cache(maxsize=64)
def _disk_offsets(radius: float) -> np.ndarray:
    """Integer offsets (k, 2) within a disk of ``radius`` (the original's dilation structure)."""
    r = int(math.floor(radius))
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    inside = dy**2 + dx**2 <= radius**2
    offsets = np.stack([dy[inside], dx[inside]], axis=1)
    offsets.flags.writeable = False
    return offsets


def _shifted_any(mask: np.ndarray, offsets: np.ndarray, pad: int, out_shape: tuple[int, int]) -> np.ndarray:
    """``out[y, x] = any(mask[pad + y + dy, pad + x + dx] for (dy, dx) in offsets)``: a dilation.

    ``mask`` is (out_h + 2 pad, out_w + 2 pad): ``out`` sees it through a ``pad`` border.
    """
    h, w = out_shape
    out = np.zeros(out_shape, dtype=bool)
    for dy, dx in offsets:
        out |= mask[pad + dy : pad + dy + h, pad + dx : pad + dx + w]
    return out


def _downsample(blown: np.ndarray, size: int) -> np.ndarray:
    """uint8 (B, B) -> float32 (size, size) in [0, 1]: PIL Lanczos in 8 bits, as scipy.misc.imresize."""
    small = Image.fromarray(blown, mode="L").resize((size, size), Image.Resampling.LANCZOS)
    return np.asarray(small, dtype=np.float32) / 255.0


@functools.lru_cache(maxsize=8192)
def _stamp(length: int, thickness: float, margin: int, aa: int, angle: float) -> _Stamp:
    """A paddle of ``length`` pixels from the patch centre in direction ``angle`` (radians, y down)."""
    half = length + math.ceil(thickness) + margin  # the stroke plus its dilation fit in the patch
    centre = half * aa
    blown_size = 2 * half * aa + 1  # odd, so the centre pixel maps onto the anchor's image pixel
    end = (round(centre + length * aa * math.sin(angle)), round(centre + length * aa * math.cos(angle)))  # (y, x)
    canvas = Image.new("L", (blown_size, blown_size), 0)
    ImageDraw.Draw(canvas).line([(centre, centre), (end[1], end[0])], fill=255, width=round(thickness * aa))
    blown = np.asarray(canvas) > 0  # (B, B)
    r = margin * aa
    dilated = _shifted_any(np.pad(blown, r), _disk_offsets(r), r, blown.shape)  # (B, B)
    size = 2 * half + 1
    stroke = _downsample(np.where(blown, 255, 0).astype(np.uint8), size)  # (S, S)
    footprint = _downsample(np.where(dilated, 255, 0).astype(np.uint8), size)  # (S, S)
    # Saturated footprint pixels: where a seed may not overlap anything (the original's structuring
    # element is the footprint cast to uint8, i.e. its pixels equal to 1). The anchor always counts.
    core = np.argwhere(footprint >= 254.5 / 255.0) - half
    core = np.unique(np.vstack([core, [[0, 0]]]), axis=0)
    # The patch shrinks by size / blown_size (not exactly 1 / aa; the centres coincide).
    tip = (np.array(end, dtype=np.float64) - centre) * (size / blown_size)
    for array in (stroke, footprint, core):
        array.flags.writeable = False
    return _Stamp(stroke=stroke, footprint=footprint, core=core, tip=tip, half=half)


@functools.lru_cache(maxsize=64)
def _candidates(radius: int, margin: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidate ends around a pivot: pixel offsets (n, 2) on a circle of ``radius`` (one
    sample per pixel of arc, duplicates removed), their angles (n,), and for each the flat offsets
    (n, k) of a disk of ``margin`` around it in a canvas ``width`` pixels wide."""
    steps = np.arange(0.0, 2 * np.pi, 1.0 / radius)
    offsets = np.unique(np.rint(radius * np.stack([np.sin(steps), np.cos(steps)], axis=1)).astype(int), axis=0)
    angles = np.arctan2(offsets[:, 0], offsets[:, 1])
    disk = _disk_offsets(margin)
    around = (offsets[:, 0] * width + offsets[:, 1])[:, None] + (disk[:, 0] * width + disk[:, 1])[None, :]
    for array in (offsets, angles, around):
        array.flags.writeable = False
    return offsets, angles, around


# --------------------------------------------------------------------------------------------------
# Snake growth


@dataclass
class _Paddle:
    anchor: np.ndarray  # (2,) int: the image pixel the stamp is centred on
    stamp: _Stamp
    contrast: float
    near: np.ndarray  # (2,) float
    far: np.ndarray  # (2,) float
    angle: float  # growth direction (near -> far), radians
    next_pivot: np.ndarray  # (2,) int: centre of the following paddle's candidate circle


def _direction(angle: float) -> np.ndarray:
    return np.array([math.sin(angle), math.cos(angle)])  # (dy, dx), y pointing down


class _Builder:
    """The snakes of one image: its random generator, its margin, and the occupancy canvases.

    Canvases (the occupancy mask and the float image) carry a ``border`` of pixels around the
    image, wide enough that a stamp anchored on any pixel near the image, and the candidate ring
    around any pivot, fit without clipping. Outside the image the occupancy is 1: nothing goes there.
    """

    def __init__(self, config: PathfinderConfig, rng: np.random.Generator, margin: int):
        self.config, self.rng, self.margin = config, rng, margin
        self.size = config.resolution
        self.length = config.paddle_length
        self.border = 2 * (config.paddle_length + math.ceil(config.paddle_thickness) + 2 * margin) + 2

    # -- canvases ------------------------------------------------------------------------------

    def empty_occupancy(self) -> np.ndarray:
        """(H + 2 border, W + 2 border) float32: 1 outside the image and on its ``padding`` frame."""
        inner = self.border + self.config.padding
        occupancy = np.ones((self.size + 2 * self.border,) * 2, dtype=np.float32)
        occupancy[inner:-inner, inner:-inner] = 0
        return occupancy

    def window(self, at: np.ndarray, half: int) -> tuple[slice, slice]:
        """The canvas slices of a (2 half + 1)^2 patch centred on image pixel ``at``."""
        y, x = int(at[0]) + self.border, int(at[1]) + self.border
        return slice(y - half, y + half + 1), slice(x - half, x + half + 1)

    def commit(self, occupancy: np.ndarray, paddle: _Paddle) -> None:
        """Max the paddle's footprint into ``occupancy``."""
        window = self.window(paddle.anchor, paddle.stamp.half)
        np.maximum(occupancy[window], paddle.stamp.footprint, out=occupancy[window])

    def collides(self, occupancy: np.ndarray, stamp: _Stamp, at: np.ndarray) -> bool:
        return float((occupancy[self.window(at, stamp.half)] + stamp.footprint).max()) >= COLLISION_SUM - TOLERANCE

    def paint(self, paddles: list[_Paddle], footprints: bool = False) -> np.ndarray:
        """The paddles' strokes times their contrasts (or their footprints), max-combined: (H, W) float32."""
        canvas = np.zeros((self.size + 2 * self.border,) * 2, dtype=np.float32)
        for paddle in paddles:
            window = self.window(paddle.anchor, paddle.stamp.half)
            patch = paddle.stamp.footprint if footprints else paddle.stamp.stroke * paddle.contrast
            np.maximum(canvas[window], patch, out=canvas[window])
        return canvas[self.border : -self.border, self.border : -self.border]

    # -- paddles -------------------------------------------------------------------------------

    def stamp(self, angle: float) -> _Stamp:
        angle = round(math.remainder(angle, 2 * math.pi), 12)  # canonical, so that cache keys repeat
        return _stamp(self.length, self.config.paddle_thickness, self.margin, self.config.antialias_scale, angle)

    def random_angle(self) -> float:
        return math.radians(int(self.rng.integers(-180, 180)))  # whole degrees, as the original

    def inside(self, point: np.ndarray) -> bool:
        y, x = point
        return 0 <= y < self.size and 0 <= x < self.size

    def seed_paddle(self, tail: np.ndarray, angle: float, contrast: float) -> _Paddle | None:
        """A snake's first paddle, from ``tail`` in direction ``angle``; None if it leaves the image."""
        stamp = self.stamp(angle)
        far = tail + stamp.tip
        behind = np.rint(tail - self.margin * _direction(angle))  # the original's pivot, behind the tail
        if not (self.inside(tail) and self.inside(np.rint(far)) and self.inside(behind)):
            return None
        next_pivot = np.rint(tail + (self.length + self.margin) * _direction(angle)).astype(int)
        return _Paddle(tail.astype(int), stamp, contrast, tail.astype(float), far, angle, next_pivot)

    def valid_tails(self, occupancy: np.ndarray, stamp: _Stamp, frame: int) -> np.ndarray:
        """Image pixels (n, 2) where a seed's footprint core lands only on free pixels."""
        occupied = occupancy > SEED_FREE_BELOW  # (H + 2 border, W + 2 border) bool
        if frame > 0:  # also keep the core out of a frame of ``frame`` pixels
            inner = slice(self.border + frame, -(self.border + frame))
            framed = np.ones_like(occupied)
            framed[inner, inner] = occupied[inner, inner]
            occupied = framed
        blocked = _shifted_any(occupied, stamp.core, self.border, (self.size, self.size))  # (H, W)
        return np.argwhere(~blocked)

    def place_seed(self, occupancy: np.ndarray, contrast: float, frame: int = 0, min_free: float | None = None) -> _Paddle | None:
        """A first paddle at a uniformly drawn free position (the original's ``seed_snake``)."""
        if min_free is not None:
            image = occupancy[self.border : -self.border, self.border : -self.border]
            if np.mean(image <= SEED_FREE_BELOW) < min_free:
                return None
        for _ in range(self.config.max_paddle_retries + 1):
            angle = self.random_angle()
            tails = self.valid_tails(occupancy, self.stamp(angle), frame)
            if len(tails) == 0:
                return None  # no room at all: the original gives up at once
            paddle = self.seed_paddle(tails[self.rng.integers(len(tails))], angle, contrast)
            if paddle is not None:
                return paddle
        return None

    def extend(self, occupancy: np.ndarray, last: _Paddle, contrast: float) -> _Paddle | None:
        """The paddle after ``last`` (the original's ``extend_snake``), or None at a dead end."""
        config, width = self.config, occupancy.shape[1]
        offsets, angles, around = _candidates(self.length + self.margin, self.margin, width)
        pivot = last.next_pivot
        # Room: the occupancy dilated by a disk of the margin at each candidate end. Candidates
        # outside the image read the border's ones and get weight 0.
        base = (pivot[0] + self.border) * width + pivot[1] + self.border
        room = 1.0 - occupancy.ravel()[base + around].max(axis=1)  # (n,)
        # Smoothness: weight by the turn from the previous paddle, zero beyond pi / (2 continuity).
        turn = np.abs((angles - last.angle + np.pi) % (2 * np.pi) - np.pi)  # (n,) in [0, pi]
        weights = np.maximum(room, 0.0) * np.cos(np.minimum(turn * config.continuity, np.pi / 2)) ** 2
        cumulative = np.cumsum(weights)  # (n,)
        total = float(cumulative[-1])
        if total < 1e-4:
            return None
        for _ in range(config.max_paddle_retries + 1):
            pick = min(int(np.searchsorted(cumulative, self.rng.random() * total, side="right")), len(angles) - 1)
            end, angle = pivot + offsets[pick], float(angles[pick])
            stamp = self.stamp(angle + math.pi)  # drawn from the far end back towards the pivot
            if not self.collides(occupancy, stamp, end):
                next_pivot = np.rint(pivot + (self.length + 2 * self.margin) * _direction(angle)).astype(int)
                return _Paddle(end, stamp, contrast, end + stamp.tip, end.astype(float), angle, next_pivot)
        return None

    # -- snakes --------------------------------------------------------------------------------

    def target_snakes(self) -> tuple[np.ndarray, list[list[_Paddle]]] | None:
        """Two target snakes grown in alternation (the original's ``two_snakes``); None: start over."""
        config, rng = self.config, self.rng
        occupancy = self.empty_occupancy()
        means = rng.permutation(np.array(config.snake_contrasts * 2))[:2]  # each target's contrast

        def contrast(snake: int) -> float:
            return float(config.paddle_contrasts[rng.integers(len(config.paddle_contrasts))] * means[snake])

        first = self.place_seed(occupancy, contrast(0), frame=2 * config.seed_distance)
        if first is None:
            return None
        for _ in range(config.max_paddle_retries + 1):
            angle, towards = self.random_angle(), math.radians(int(rng.integers(0, 360)))
            tail = np.rint(first.near + config.seed_distance * _direction(towards))
            second = self.seed_paddle(tail, angle, contrast(1))
            if second is not None:
                break
        else:
            return None
        snakes = [[first], [second]]
        for _ in range(config.contour_length - 1):
            for s in (0, 1):
                # Tested against everything except this snake's newest paddle (the next one comes
                # within 2 margins of it); the original also leaves out the other snake's newest.
                trial = occupancy
                if config.separate_targets:
                    trial = occupancy.copy()
                    self.commit(trial, snakes[1 - s][-1])
                paddle = self.extend(trial, snakes[s][-1], contrast(s))
                if paddle is None:
                    return None
                self.commit(occupancy, snakes[s][-1])
                snakes[s].append(paddle)
        for snake in snakes if config.separate_targets else snakes[1:]:  # the original forgets snake 0's
            self.commit(occupancy, snake[-1])
        return occupancy, snakes

    def free_snake(self, occupancy: np.ndarray, length: int) -> list[_Paddle] | None:
        """A distractor snake in the free space (the original's ``make_snake``), committed on success."""
        config = self.config

        def contrast() -> float:
            return config.snake_contrasts[self.rng.integers(len(config.snake_contrasts))]

        trial = occupancy.copy()
        paddles = [self.place_seed(trial, contrast(), min_free=MIN_FREE_FRACTION)]
        if paddles[0] is None:
            return None
        for _ in range(length - 1):
            paddle = self.extend(trial, paddles[-1], contrast())
            if paddle is None:
                return None
            self.commit(trial, paddles[-1])
            paddles.append(paddle)
        self.commit(trial, paddles[-1])
        occupancy[...] = trial
        return paddles

    def free_snakes(self, occupancy: np.ndarray, count: int, length: int, retries: int) -> list[list[_Paddle]]:
        """Up to ``count`` snakes of ``length``; one that fails ``retries + 1`` times is dropped."""
        snakes = []
        for _ in range(count):
            for _ in range(retries + 1):
                snake = self.free_snake(occupancy, length)
                if snake is not None:
                    snakes.append(snake)
                    break
        return snakes


def _num_single_paddles(config: PathfinderConfig, margin: int) -> int:
    """The original's count of single-paddle distractors (``snakes2.from_wrapper``)."""
    total = int(150 / ((7.5 + 13 * margin + 4 * margin * margin) / 123.5))
    return max(total - 2 * config.contour_length - config.num_distractor_snakes * config.distractor_length, 0)


# --------------------------------------------------------------------------------------------------
# Rendering


def _marker(config: PathfinderConfig, centre: np.ndarray) -> np.ndarray:
    """A filled circle centred on pixel ``centre``, drawn at the antialias scale: (H, W) float32 in [0, 1]."""
    aa, size = config.antialias_scale, config.resolution
    coords = np.arange(size * aa)  # antialiased pixel i covers image pixel (i + 0.5) / aa - 0.5
    cy, cx = (centre + 0.5) * aa - 0.5
    inside = (coords[:, None] - cy) ** 2 + (coords[None, :] - cx) ** 2 <= (config.marker_radius * aa) ** 2
    return _downsample(np.where(inside, 255, 0).astype(np.uint8), size)


def _bytescale(image: np.ndarray) -> np.ndarray:
    """float -> uint8 exactly as ``scipy.misc.imsave`` (via ``bytescale``) stored the original images."""
    low, high = float(image.min()), float(image.max())
    scale = 255.0 / (high - low if high > low else 1.0)
    return np.clip((image - low) * scale + 0.5, 0, 255).astype(np.uint8)


def _snake(paddles: list[_Paddle]) -> Snake:
    return Snake(
        near=np.array([p.near for p in paddles], dtype=np.float64), far=np.array([p.far for p in paddles], dtype=np.float64)
    )


def generate_sample(config: PathfinderConfig, seed: int, index: int) -> Sample:
    """Image ``index`` of the dataset ``seed``: deterministic in (config, seed, index) alone."""
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be >= 0, got seed={seed}, index={index}")
    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    label = int(rng.integers(2))
    margin = int(config.paddle_margins[rng.integers(len(config.paddle_margins))])
    builder = _Builder(config, rng, margin)
    for attempt in range(1, config.max_image_retries + 1):  # noqa: B007 (the sample records its attempts)
        targets = builder.target_snakes()
        if targets is not None:
            break
    else:
        raise RuntimeError(
            f"could not grow the two target snakes in {config.max_image_retries} attempts "
            f"(seed={seed}, index={index}); the parameters leave too little room: {config}"
        )
    occupancy, snakes = targets
    distractors = builder.free_snakes(
        occupancy, config.num_distractor_snakes, config.distractor_length, config.max_distractor_retries
    )
    if config.use_single_paddles:
        distractors += builder.free_snakes(occupancy, _num_single_paddles(config, margin), 1, config.max_paddle_retries)

    a = int(rng.integers(2))  # which target carries the first marker
    snake_a, snake_b = _snake(snakes[a]), _snake(snakes[1 - a])
    markers = np.stack([snake_a.start_tip, (snake_a if label == 1 else snake_b).end_tip])  # (2, 2)
    image = builder.paint([p for snake in snakes + distractors for p in snake])  # (H, W) float32
    for centre in markers:
        np.maximum(image, _marker(config, centre), out=image)
    footprints = np.stack([builder.paint(snakes[a], footprints=True), builder.paint(snakes[1 - a], footprints=True)])
    return Sample(
        image=_bytescale(image),
        label=label,
        margin=margin,
        snake_a=snake_a,
        snake_b=snake_b,
        distractors=[_snake(d) for d in distractors],
        markers=markers,
        footprints=footprints,
        attempts=attempt,
    )


# --------------------------------------------------------------------------------------------------
# Datasets on disk


def metadata_line(config: PathfinderConfig, folder: int, position: int, label: int, margin: int) -> str:
    """One metadata line in the original's field order (values formatted with ``str``, as numpy did)."""
    fields = (
        f"imgs/{folder}",
        f"sample_{position}.png",
        position,
        label,
        config.continuity,
        config.contour_length,
        config.distractor_length,
        config.paddle_length,
        config.paddle_thickness,
        margin,
        len(config.paddle_contrasts),
    )
    return " ".join(str(f) for f in fields)


def _generate_range(task: tuple[str, PathfinderConfig, int, int, int, int]) -> list[tuple[int, int]]:
    """Worker: write images ``start..stop-1`` under ``root``; return their (label, margin)."""
    root, config, seed, start, stop, per_folder = task
    results = []
    for index in range(start, stop):
        sample = generate_sample(config, seed, index)
        folder, position = divmod(index, per_folder)
        Image.fromarray(sample.image, mode="L").save(os.path.join(root, "imgs", str(folder), f"sample_{position}.png"))
        results.append((sample.label, sample.margin))
    return results


def _description(config: PathfinderConfig, num_samples: int, seed: int, images_per_folder: int) -> dict:
    return {
        "generator": "lra.data.pathfinder_generator",
        "version": GENERATOR_VERSION,
        "config": asdict(config),
        "num_samples": num_samples,
        "seed": seed,
        "images_per_folder": images_per_folder,
    }


def _describes(folder: Path, config: PathfinderConfig, num_samples: int, seed: int, images_per_folder: int) -> bool:
    """Whether ``folder``'s ``generator.json`` is this generator's, for this dataset (whatever its files)."""
    try:
        recorded = json.loads((Path(folder) / GENERATOR_JSON).read_text())
    except (OSError, ValueError):
        return False
    recorded.pop("files", None)
    return recorded == json.loads(json.dumps(_description(config, num_samples, seed, images_per_folder)))


def generated_problem(
    folder: Path, config: PathfinderConfig, num_samples: int, seed: int, images_per_folder: int = 1000
) -> str | None:
    """Why ``folder`` is not this intact dataset (None when it is): its ``generator.json`` (written last, before the
    rename) is missing or describes another dataset, records no files (an earlier version wrote it), or a file
    differs from its record (:mod:`lra.data.records`)."""
    folder = Path(folder)
    if not _describes(folder, config, num_samples, seed, images_per_folder):
        return f"{folder / GENERATOR_JSON} is missing, unreadable or describes another dataset"
    files = json.loads((folder / GENERATOR_JSON).read_text()).get("files")
    if not files:
        return f"{GENERATOR_JSON} records no sizes or checksums of the files (written by an earlier version)"
    return records.difference(folder, files, GENERATOR_JSON)


def is_complete(folder: Path, config: PathfinderConfig, num_samples: int, seed: int, images_per_folder: int = 1000) -> bool:
    """Whether ``folder`` holds this exact dataset, intact."""
    return generated_problem(folder, config, num_samples, seed, images_per_folder) is None


def _write_dataset(
    folder: Path,
    config: PathfinderConfig,
    num_samples: int,
    seed: int,
    images_per_folder: int,
    workers: int | None,
    progress: bool,
    replace: bool = False,
) -> Path:
    """Generate into a temporary sibling of ``folder`` and rename it into place (``replace``: over a damaged one)."""

    def complete(done: Path) -> bool:  # a concurrent run of the same dataset renamed its copy first
        return is_complete(done, config, num_samples, seed, images_per_folder)

    with staged_folder(folder, complete=complete, replace=replace) as staging:
        num_folders = -(-num_samples // images_per_folder)
        for k in range(num_folders):
            (staging / "imgs" / str(k)).mkdir(parents=True)
        (staging / "metadata").mkdir()
        workers = workers or os.cpu_count() or 1
        # Tasks of at most 50 images: a smooth progress bar and a balanced pool (the output does
        # not depend on the split: image g is always generate_sample(config, seed, g)).
        chunk = max(1, min(50, num_samples // (4 * workers)))
        tasks = [
            (str(staging), config, seed, start, min(start + chunk, num_samples), images_per_folder)
            for start in range(0, num_samples, chunk)
        ]
        workers = min(workers, len(tasks))
        results: list[tuple[int, int]] = []
        with tqdm(total=num_samples, disable=not progress, unit="img", desc=f"Pathfinder{config.resolution}") as bar:
            if workers > 1:
                with multiprocessing.Pool(workers) as pool:
                    for part in pool.imap(_generate_range, tasks):  # in order: results match a serial run
                        results += part
                        bar.update(len(part))
            else:
                for task in tasks:
                    part = _generate_range(task)
                    results += part
                    bar.update(len(part))
        for k in range(num_folders):
            indices = range(k * images_per_folder, min((k + 1) * images_per_folder, num_samples))
            lines = [metadata_line(config, k, g - k * images_per_folder, *results[g]) for g in indices]
            (staging / "metadata" / f"{k}.npy").write_text("".join(line + "\n" for line in lines))
        description = _description(config, num_samples, seed, images_per_folder)
        description["files"] = records.describe(staging, skip=(GENERATOR_JSON,))
        (staging / GENERATOR_JSON).write_text(json.dumps(description, indent=2) + "\n")
    return folder


def _check_sizes(num_samples: int, seed: int, images_per_folder: int, workers: int | None) -> None:
    if num_samples < 1 or images_per_folder < 1 or seed < 0 or (workers is not None and workers < 1):
        raise ValueError(
            f"need num_samples >= 1, images_per_folder >= 1, seed >= 0 and workers >= 1 (or None), "
            f"got num_samples={num_samples}, images_per_folder={images_per_folder}, seed={seed}, "
            f"workers={workers}"
        )


def generate(
    out_dir: Path,
    config: PathfinderConfig,
    num_samples: int,
    seed: int,
    *,
    images_per_folder: int = 1000,
    workers: int | None = None,
    progress: bool = True,
) -> Path:
    """Write ``num_samples`` images in the official layout into ``out_dir`` (which must not exist).

    Images are generated by ``workers`` processes (default: every core) and are byte-identical to a
    serial run. Everything is written into a temporary sibling folder that is renamed to ``out_dir``
    at the end, so an interrupted run leaves no partial ``out_dir``. An existing ``out_dir`` is never
    touched: ``FileExistsError`` (use :func:`ensure_generated` to reuse a complete folder).
    """
    _check_sizes(num_samples, seed, images_per_folder, workers)
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; choose another output folder or delete it")
    return _write_dataset(out_dir, config, num_samples, seed, images_per_folder, workers, progress)


def folder_name(config: PathfinderConfig, num_samples: int, seed: int, images_per_folder: int = 1000) -> str:
    """A folder name that encodes every parameter, the sample count, the seed and the generator version."""
    c = config

    def join(values) -> str:
        return "_".join(f"{v:g}" for v in values)

    return (
        f"pathfinder{c.resolution}-v{GENERATOR_VERSION}-pad{c.padding}-pl{c.paddle_length}-pt{c.paddle_thickness:g}"
        f"-pm{join(c.paddle_margins)}-mr{c.marker_radius:g}-aa{c.antialias_scale}-sd{c.seed_distance}"
        f"-ct{c.continuity:g}-cl{c.contour_length}-dl{c.distractor_length}-nd{c.num_distractor_snakes}"
        f"-sc{join(c.snake_contrasts)}-pc{join(c.paddle_contrasts)}-sp{int(c.use_single_paddles)}"
        f"-st{int(c.separate_targets)}"
        f"-rt{c.max_paddle_retries}_{c.max_distractor_retries}_{c.max_image_retries}"
        f"-ipf{images_per_folder}-n{num_samples}-seed{seed}"
    )


def ensure_generated(
    cache_dir: Path,
    config: PathfinderConfig,
    num_samples: int,
    seed: int,
    workers: int | None = None,
    *,
    images_per_folder: int = 1000,
    progress: bool = True,
) -> Path:
    """``cache_dir/<folder_name(...)>``, generated unless it is there and intact.

    Processes that start at once generate it once: the first takes the folder's lock (an OS lock, released when
    its process ends) and generates; the others wait, then find its files and check them. Before use every file
    is checked against the record in ``generator.json`` (sizes and counts, then SHA-256); a generated folder
    that differs is named in a log line and generated again. A folder of that name that is not this generator's
    (no ``generator.json``, or one describing another dataset) is reported, never overwritten.
    """
    _check_sizes(num_samples, seed, images_per_folder, workers)
    folder = Path(cache_dir) / folder_name(config, num_samples, seed, images_per_folder)
    with folder_lock(folder, f"the Pathfinder{config.resolution} data"):
        problem = generated_problem(folder, config, num_samples, seed, images_per_folder)
        if problem is None:
            return folder
        if folder.exists():
            if not _describes(folder, config, num_samples, seed, images_per_folder):
                raise RuntimeError(
                    f"{folder} exists but is not a complete generated dataset for these parameters ({problem}); delete it"
                )
            log.warning("Generating Pathfinder%d again: %s", config.resolution, problem)
        if progress:
            log.info("Generating %d Pathfinder%d images (seed %d) into %s", num_samples, config.resolution, seed, folder)
        return _write_dataset(folder, config, num_samples, seed, images_per_folder, workers, progress, replace=folder.exists())
