"""Labelled data for the examples that have some: scikit-learn's 8x8 digits, which ships inside the
scikit-learn package (no download). One fixed split, the same for training the example, calibrating
its quantization and measuring its accuracy."""

from __future__ import annotations

import numpy as np

DATASETS = ("digits",)


def digits() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(train images, train labels, test images, test labels); images float32 [N, 1, 8, 8] in [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    x_train, x_test, y_train, y_test = train_test_split(
        images, data.target, test_size=0.3, random_state=0, stratify=data.target
    )
    return x_train, y_train.astype(np.int64), x_test, y_test.astype(np.int64)


def load(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if name != "digits":
        raise ValueError(f"unknown dataset {name!r}")
    return digits()
