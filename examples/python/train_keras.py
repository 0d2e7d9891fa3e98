"""Train a small CNN with Keras (TensorFlow) on a synthetic ImageNet-like JPEG set read through prestage.

    python examples/python/train_keras.py

The first run writes the data set (``prestage synth``'s recipe: JPEGs of about 500x375 cut from real photos,
a learnable look per class) under the system's temporary folder, or under ``--data``; later runs reuse it.
``model.fit`` prints the training loss and accuracy and the validation accuracy of each epoch; then the
images/s of the whole run.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import tensorflow as tf

import prestage
import prestage.tf
from prestage.synth import make_synthetic_set

keras = tf.keras

# ImageNet's channel statistics, on the 0-1 scale.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "prestage-examples",
                   help="folder for the synthetic sets (default: %(default)s)")
    p.add_argument("--images", type=int, default=2000, help="training images (default: %(default)s)")
    p.add_argument("--classes", type=int, default=10, help="classes (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=2, help="epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="(default: %(default)s)")
    p.add_argument("--image-size", type=int, default=64,
                   help="side of the square crop (default: %(default)s)")
    p.add_argument("--stage-dir", type=Path, default=None, help="node-local folder to stage the files to")
    p.add_argument("--readers", type=int, default=2, help="decode threads (default: %(default)s)")
    return p.parse_args()


def small_cnn(size: int, classes: int) -> keras.Model:
    layers = [
        keras.Input(shape=(size, size, 3), dtype="uint8"),  # prestage's NHWC uint8 batches
        keras.layers.Rescaling(1 / 255),
        keras.layers.Normalization(mean=MEAN, variance=[s * s for s in STD]),
    ]
    for filters in (32, 64, 128, 128):
        # momentum=0.9: the running statistics that validation uses must settle within a short run.
        layers += [keras.layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False),
                   keras.layers.BatchNormalization(momentum=0.9), keras.layers.ReLU()]
    layers += [keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(classes)]
    return keras.Sequential(layers)


def main() -> None:
    args = parse_args()
    train_dir = args.data / f"train-{args.images}-{args.classes}"
    val_dir = args.data / f"val-{args.images // 5}-{args.classes}"
    make_synthetic_set(train_dir, images=args.images, classes=args.classes, seed=0, overwrite=True)
    make_synthetic_set(val_dir, images=args.images // 5, classes=args.classes, seed=1, overwrite=True)
    train_set, val_set = prestage.Catalog.from_folder(train_dir), prestage.Catalog.from_folder(val_dir)

    size = (args.image_size, args.image_size)
    train = prestage.tf.dataset(train_set, args.batch_size, size, stage_dir=args.stage_dir,
                                readers=args.readers, seed=0)
    val = prestage.tf.dataset(val_set, args.batch_size, size, shuffle=False, readers=args.readers)
    print(f"{len(train_set)} training and {len(val_set)} validation images, {args.classes} classes, "
          f"{int(train.cardinality())} batches of {args.batch_size} per epoch")

    keras.utils.set_random_seed(0)
    model = small_cnn(args.image_size, args.classes)
    steps = args.epochs * int(train.cardinality())
    model.compile(
        optimizer=keras.optimizers.SGD(keras.optimizers.schedules.CosineDecay(0.05, steps), momentum=0.9),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"])
    start = time.perf_counter()
    # The order (a new global shuffle each epoch) is prestage's: Keras's shuffle does not apply.
    history = model.fit(train, epochs=args.epochs, validation_data=val, shuffle=False, verbose=2)
    seconds = time.perf_counter() - start
    for epoch in range(args.epochs):
        h = {k: v[epoch] for k, v in history.history.items()}
        print(f"epoch {epoch + 1}/{args.epochs}: loss {h['loss']:.3f}, accuracy {h['accuracy']:.3f}, "
              f"validation accuracy {h['val_accuracy']:.3f}")
    images = args.epochs * (len(train_set) + len(val_set))
    print(f"{images / seconds:.0f} images/s over {args.epochs} epochs (training and validation)")


if __name__ == "__main__":  # make_synthetic_set starts worker processes
    main()
