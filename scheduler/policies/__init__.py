"""Built-in placement policies; importing this package registers them."""

from . import best_fit  # noqa: F401
