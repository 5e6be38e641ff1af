"""Built-in placement policies; importing this package registers them."""

from . import best_fit, dot_product, fgd, gpulab, packing, random_fit  # noqa: F401
