"""Stage 3's random transforms: reproduce the crops a loader with ``transform="random-resized-crop"`` drew.

>>> top, left, h, w, flip = prestage.transforms.random_resized_crop_params(
...     seed=0, epoch=3, index=17, height=375, width=500)
"""

from prestage._core import transforms as _transforms

random_resized_crop_params = _transforms.random_resized_crop_params
crop_draws = _transforms.crop_draws

__all__ = ["crop_draws", "random_resized_crop_params"]
