"""Grayscale CIFAR-10 (Krizhevsky, 2009), LRA's "Image" task: the reader of ``cifar-10-batches-py``.

Official format: the CIFAR-10 python version (``cifar-10-python.tar.gz``) unpacks to
``cifar-10-batches-py/`` with ``data_batch_1`` ... ``data_batch_5`` (10,000 images each) and
``test_batch`` (10,000). Each file is a Python pickle of a dict with bytes keys: ``b"data"`` is a
uint8 array of shape (N, 3072) whose rows hold an image's red, green and blue 32x32 planes one
after the other, each row-major, and ``b"labels"`` is a list of N ints 0-9. Unpickling can run
arbitrary code, so the files are loaded with an unpickler that allows only the globals they need
(numpy's array reconstruction and dtype) and refuses anything else.

Tokenisation, as LRA's ``tf.image.rgb_to_grayscale`` on uint8 images: the pixels are converted to
float32 in [0, 1] (``x * (1/255)``), combined with the weights (0.2989, 0.5870, 0.1140) in float32,
and converted back to uint8 as ``tf.image.convert_image_dtype`` does (multiply by 255.5, truncate).
The 32x32 gray image is flattened row-major to 1024 uint8 tokens, the intensities 0-255 themselves
(no normalisation; LRA's vocabulary is 256). ``max_length`` must be 1024: nothing is cut or padded.

Splits, as LRA's ``train[:90%]`` / ``train[90%:]`` / ``test``: train is the first 90% (n * 9 // 10)
of the five data batches concatenated in file order, val is the rest, test is ``test_batch``:
45,000 / 5,000 / 10,000 images.

Deviation: TFDS stores the training images in another order than the pickles, so the 5,000
validation images are not the same subset as LRA's (the sizes are). TensorFlow computes the
weighted sum as a matrix product, which may round differently in the last bit of the float32 sum;
that changes a token only when the sum lands exactly on an integer boundary.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from .formats import Prepared, Split

CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
NUM_PIXELS = 32 * 32
NUM_CLASSES = 10
VOCAB_SIZE = 257  # pixels 0..255, shifted by one when pixel 0 is not padding (lra.data.tasks)
GRAY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)  # tf.image.rgb_to_grayscale's


class BatchUnpickler(pickle.Unpickler):
    """Loads a CIFAR-10 batch and nothing else: a global other than numpy's array reconstruction
    (the module is ``numpy.core.multiarray`` in the official files, ``numpy._core.multiarray``
    when NumPy 2 wrote them) is refused instead of imported."""

    ALLOWED = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
        }
    )

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(
                f"refused to load the forbidden global {module}.{name}: a CIFAR-10 batch needs only numpy "
                "array reconstruction, and a pickle naming anything else could run arbitrary code"
            )
        return super().find_class(module, name)


def describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    return f"a {type(value).__name__}"


def load_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch as its RGB rows (N, 3072) uint8 and labels (N,) int64, checked."""
    try:
        with open(path, "rb") as f:
            batch = BatchUnpickler(f, encoding="bytes").load()
    except Exception as error:  # a truncated or damaged pickle can fail with almost any exception type
        raise ValueError(f"{path}: not a readable CIFAR-10 python batch ({type(error).__name__}: {error})") from None
    if not isinstance(batch, dict):
        raise ValueError(f"{path}: expected a dict with the keys b'data' and b'labels', got {describe(batch)}")
    missing = [key for key in (b"data", b"labels") if key not in batch]
    if missing:
        raise ValueError(f"{path}: the batch lacks the keys {missing}; it has {sorted(batch, key=repr)}")
    data, labels = batch[b"data"], batch[b"labels"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.shape[1:] != (3 * NUM_PIXELS,):
        raise ValueError(f"{path}: b'data' must be a uint8 array of shape (N, {3 * NUM_PIXELS}), got {describe(data)}")
    if len(data) == 0:
        raise ValueError(f"{path}: the batch holds no images")
    if not isinstance(labels, list) or len(labels) != len(data):
        raise ValueError(f"{path}: b'labels' must be a list of {len(data)} ints, one per image, got {describe(labels)}")
    for index, label in enumerate(labels):
        if type(label) is not int or not 0 <= label < NUM_CLASSES:
            raise ValueError(f"{path}: label {index} must be an int 0-{NUM_CLASSES - 1}, got {label!r}")
    return data, np.array(labels, dtype=np.int64)


def grayscale(rgb: np.ndarray) -> np.ndarray:
    """(N, 3072) channel-major RGB rows -> (N, 1024) gray pixels, as ``tf.image.rgb_to_grayscale``."""
    planes = rgb.reshape(len(rgb), 3, NUM_PIXELS).astype(np.float32) * np.float32(1 / 255)
    red, green, blue = planes[:, 0], planes[:, 1], planes[:, 2]
    gray = red * GRAY_WEIGHTS[0] + green * GRAY_WEIGHTS[1] + blue * GRAY_WEIGHTS[2]
    return (gray * np.float32(255.5)).astype(np.uint8)


def load_gray(paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """The batches at ``paths``, concatenated in order, as gray tokens and labels."""
    batches = [load_batch(path) for path in paths]
    pixels = np.concatenate([grayscale(data) for data, _ in batches])
    labels = np.concatenate([labels for _, labels in batches])
    return pixels, labels


def read(source: Path, *, max_length: int = NUM_PIXELS) -> Prepared:
    """The six batches of ``source`` (a ``cifar-10-batches-py`` folder) as 1024 gray tokens per image."""
    source = Path(source)
    missing = [name for name in (*TRAIN_FILES, TEST_FILE) if not (source / name).is_file()]
    if missing:
        raise FileNotFoundError(missing_data_message(source, missing))
    if max_length != NUM_PIXELS:
        raise ValueError(f"a CIFAR-10 image is {NUM_PIXELS} tokens: max_length must be {NUM_PIXELS}, got {max_length}")
    pixels, labels = load_gray([source / name for name in TRAIN_FILES])
    test_pixels, test_labels = load_gray([source / TEST_FILE])
    cut = len(labels) * 9 // 10
    return Prepared(
        {
            "train": Split(arrays={"input_ids": pixels[:cut]}, labels=labels[:cut]),
            "val": Split(arrays={"input_ids": pixels[cut:]}, labels=labels[cut:]),
            "test": Split(arrays={"input_ids": test_pixels}, labels=test_labels),
        }
    )


def missing_data_message(source: Path, missing: list[str] | None = None) -> str:
    return (
        f"CIFAR-10 data not found in {source}: missing {', '.join(missing or (*TRAIN_FILES, TEST_FILE))}. Expected the "
        "'cifar-10-batches-py' folder of the CIFAR-10 python version, with data_batch_1 ... data_batch_5 "
        "and test_batch. Run `python -m lra.data download image` (downloads, verifies, unpacks and prepares "
        f"it), or download {CIFAR_URL} yourself, unpack it (tar xzf), and run "
        "`python -m lra.data prepare image --source <dir>/cifar-10-batches-py` (or point "
        "task.data.source_dir at that folder)."
    )
