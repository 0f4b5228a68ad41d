"""Pathfinder (Linsley et al., 2018) and Path-X as LRA uses them: the reader of one difficulty folder.

Official format: a difficulty folder of the LRA release, e.g.
``lra_release/pathfinder32/curv_contour_length_14`` (LRA's Pathfinder, the "hard" level) or
``lra_release/pathfinder128/curv_contour_length_14`` (Path-X), holds

* ``metadata/<k>.npy``: plain text despite the extension, one line per image with space-separated
  fields: the image folder (``imgs/<k>``), the file name (``sample_<i>.png``), the index, the label
  (0 or 1: are the two circles connected?) and generator parameters that are not used;
* ``imgs/<k>/sample_<i>.png``: 8-bit grayscale PNGs, 32x32 (Pathfinder) or 128x128 (Path-X).

The metadata files are read in the order of their integer stems and their lines in order; an image
is ``<folder>/<field 0>/<field 1>``. A zero-byte image is empty (the release has one, in
``pathfinder32/curv_baseline``): like LRA, the reader skips it and lists it in
``Prepared.notes["skipped_empty"]``. Any other problem (a short metadata line, a bad label, an image
that is missing, unreadable, not 8-bit grayscale or of the wrong size) is an error.

Tokenisation, as LRA: the pixel intensities 0-255, flattened row-major, are the tokens (uint8), so
``max_length`` is the number of pixels: 1024 for 32x32, 16384 for 128x128. Decoding 200,000 PNGs
takes a while, so large folders are decoded by a pool of processes (with a progress bar).

Splits: LRA releases no split and every implementation re-splits 80/10/10 (TFDS slices, an unseeded
shuffle in Nystromformer, seed 42 in S4). Here the images, in the order above, are permuted with
``np.random.default_rng(split_seed).permutation(n)``: the first n * 8 // 10 are train, the next
n // 10 val, the rest test (160,000 / 20,000 / 20,000 for 200,000 images), each in permutation
order. The split is therefore deterministic but not the same subsets as any published run.
"""

from __future__ import annotations

import math
import multiprocessing
import os
from functools import partial
from pathlib import Path

import numpy as np
from PIL import Image
from tqdm import tqdm

from .formats import LRA_RELEASE_URL, Prepared, Split

#: Fewer images than this are decoded in this process: starting a pool would cost more than it saves.
PARALLEL_MIN_IMAGES = 2000
LABELS = {"0": 0, "1": 1}
NUM_CLASSES = len(LABELS)
VOCAB_SIZE = 257  # pixels 0..255, shifted by one when pixel 0 is not padding (lra.data.tasks)


def metadata_files(source: Path) -> list[Path]:
    """``source/metadata/<k>.npy`` in the order of ``k``."""
    folder = source / "metadata"
    if not folder.is_dir():
        raise FileNotFoundError(missing_data_message(source, f"there is no metadata folder {folder}"))
    files = list(folder.glob("*.npy"))
    if not files:
        raise FileNotFoundError(missing_data_message(source, f"the metadata folder {folder} has no <k>.npy files"))
    for path in files:
        if not path.stem.isdigit():
            raise ValueError(f"{path}: a metadata file must be named <k>.npy with an integer k")
    return sorted(files, key=lambda path: int(path.stem))


def read_metadata(source: Path) -> tuple[list[Path], list[int], list[str]]:
    """The images the metadata lists, in order: their paths and labels, and the empty files skipped."""
    paths, labels, skipped = [], [], []
    for metadata in metadata_files(source):
        for number, line in enumerate(metadata.read_text(encoding="utf-8").splitlines(), start=1):
            fields = line.split()
            if len(fields) < 4:
                raise ValueError(
                    f"{metadata}:{number}: expected at least 4 space-separated fields "
                    f"(image folder, file name, index, label), got {len(fields)}"
                )
            if fields[3] not in LABELS:
                raise ValueError(f"{metadata}:{number}: the label (field 4) must be 0 or 1, got {fields[3]!r}")
            relative = Path(fields[0], fields[1])
            path = source / relative
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                raise FileNotFoundError(f"{path}: image listed in {metadata}:{number} does not exist") from None
            if size == 0:
                skipped.append(relative.as_posix())
                continue
            paths.append(path)
            labels.append(LABELS[fields[3]])
    return paths, labels, skipped


def decode(path: str, side: int) -> np.ndarray:
    """One PNG as its ``side * side`` pixels, row-major; an error names the file."""
    try:
        with Image.open(path) as image:
            if image.mode != "L":
                raise ValueError(f"{path}: expected an 8-bit grayscale image (PIL mode L), got mode {image.mode}")
            if image.size != (side, side):
                width, height = image.size
                raise ValueError(
                    f"{path}: the image is {width}x{height} but max_length={side * side} needs {side}x{side} "
                    "(Pathfinder: 32x32 and 1024, Path-X: 128x128 and 16384)"
                )
            return np.asarray(image, dtype=np.uint8).reshape(-1)
    except (OSError, SyntaxError) as error:  # PIL's errors for unreadable or damaged files
        raise ValueError(f"{path}: not a readable PNG ({error})") from None


def decode_all(paths: list[Path], side: int, workers: int | None) -> np.ndarray:
    """Decode ``paths`` in order into (len(paths), side * side) uint8, in parallel when worthwhile."""
    pixels = np.empty((len(paths), side * side), dtype=np.uint8)
    processes = workers or os.cpu_count() or 1
    decode_one = partial(decode, side=side)
    names = [str(path) for path in paths]
    progress = partial(tqdm, total=len(paths), desc="decoding Pathfinder images", unit="img")
    if processes > 1 and len(paths) >= PARALLEL_MIN_IMAGES:
        chunksize = max(1, min(256, len(paths) // (4 * processes)))
        with multiprocessing.Pool(processes) as pool:
            for index, row in enumerate(progress(pool.imap(decode_one, names, chunksize=chunksize))):
                pixels[index] = row
    else:
        for index, row in enumerate(progress(map(decode_one, names))):
            pixels[index] = row
    return pixels


def split_order(num_images: int, split_seed: int) -> tuple[np.ndarray, dict[str, slice]]:
    """The seeded 80/10/10 split: a permutation of the images and the slice of it each split takes."""
    order = np.random.default_rng(split_seed).permutation(num_images)
    num_train, num_val = num_images * 8 // 10, num_images // 10
    num_seen = num_train + num_val
    slices = {"train": slice(0, num_train), "val": slice(num_train, num_seen), "test": slice(num_seen, None)}
    return order, slices


def read(source: Path, *, max_length: int = 1024, split_seed: int = 0, workers: int | None = None) -> Prepared:
    """The images of ``source`` (one difficulty folder) as pixel tokens, split 80/10/10 by ``split_seed``.

    ``workers`` is the number of decoding processes (default: every core; 1 decodes here).
    """
    source = Path(source)
    if not source.is_dir():
        raise FileNotFoundError(missing_data_message(source, f"{source} does not exist"))
    paths, labels, skipped = read_metadata(source)
    side = math.isqrt(max_length)
    if side * side != max_length:
        raise ValueError(f"max_length={max_length} is not the size of a square image (32x32 = 1024, 128x128 = 16384)")
    if len(paths) < 10:
        raise ValueError(f"{source}: {len(paths)} non-empty images, too few for an 80/10/10 split (need 10 or more)")
    order, slices = split_order(len(paths), split_seed)
    # Decoding in permutation order makes every split a slice of one array (Path-X's is 3.3 GB).
    pixels = decode_all([paths[i] for i in order], side, workers)
    labels_in_order = np.array(labels, dtype=np.int64)[order]
    splits = {name: Split(arrays={"input_ids": pixels[rows]}, labels=labels_in_order[rows]) for name, rows in slices.items()}
    return Prepared(splits, {"skipped_empty": skipped})


def missing_data_message(source: Path, problem: str | None = None) -> str:
    return (
        f"Pathfinder data not found in {source}: {problem or f'{source} does not exist'}. Expected a difficulty "
        "folder of the LRA release "
        "with metadata/<k>.npy (plain text, one line per image: imgs/<k> sample_<i>.png <index> <label> ...) "
        "and imgs/<k>/sample_<i>.png (8-bit grayscale PNGs). Run `python -m lra.data download pathfinder` "
        "(Path-X: `download pathx`; downloads, verifies, unpacks and prepares the folder), or point "
        "task.data.source_dir at lra_release/pathfinder32/curv_contour_length_14 (Pathfinder; Path-X: "
        f"lra_release/pathfinder128/curv_contour_length_14) of the official release ({LRA_RELEASE_URL}, a tar "
        "archive despite its name: tar xf), or generate the data with `python -m lra.data generate pathfinder "
        "--out DIR` (or task.data.source=generated)."
    )
