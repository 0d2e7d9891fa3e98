"""prestage: a mini-batch data loader that overlaps staging from a parallel file system to node-local
SSD with decoding into pinned batch buffers.

>>> import prestage
>>> catalog = prestage.Catalog.from_folder("/pfs/imagenet/train")
>>> with prestage.Loader(catalog, batch_size=256, image_size=(224, 224),
...                      stage_dir="/local/ssd/stage") as loader:
...     for batch in loader:
...         batch.images, batch.labels    # zero-copy NumPy views
"""

from prestage import options, pack, plan, state, trace, transforms
from prestage._core import Batch, Catalog, __version__
from prestage.errors import ConfigError, DecodeError, Error, IoError
from prestage.loader import Loader
from prestage import hf as _hf

# Catalog.from_hf is written in Python (it uses pyarrow, imported only when it is called).
setattr(Catalog, "from_hf", staticmethod(_hf.from_hf))

__all__ = [
    "Batch",
    "Catalog",
    "ConfigError",
    "DecodeError",
    "Error",
    "IoError",
    "Loader",
    "__version__",
    "options",
    "pack",
    "plan",
    "state",
    "trace",
    "transforms",
]
