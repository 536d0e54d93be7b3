"""The one factory of every engine's natural-bias classes: ``NaturalBias<X>``
is ``(mixin, X)`` for an engine's stock class ``X``, made once, in the
mixin's module and set there by name so that pickle finds it (a module that
a fresh process must find them in makes them by name in its ``__getattr__``)."""

import sys
from typing import Optional

PREFIX = "NaturalBias"
_MADE: dict = {}  # (stock, mixin) -> its natural-bias class


def natural_bias_subclass(stock: type, mixin: Optional[type], **attributes) -> type:
    """``NaturalBias<stock>``: ``(mixin, stock)``, or for ``mixin`` None (a
    configuration) ``stock`` with ``attributes`` (its ``__module__`` among them)."""
    if (stock, mixin) not in _MADE:
        name = PREFIX + stock.__name__
        namespace = {"__module__": getattr(mixin, "__module__", None), "__qualname__": name}
        namespace.update(__doc__=f"{stock.__name__} with the natural bias.", **attributes)
        bases = (stock,) if mixin is None else (mixin, stock)
        made = _MADE[stock, mixin] = type(name, bases, namespace)
        setattr(sys.modules[made.__module__], name, made)
    return _MADE[stock, mixin]


def stock_name(name: str) -> Optional[str]:
    """``X`` of ``NaturalBias<X>``, else None."""
    return name[len(PREFIX) :] if name.startswith(PREFIX) else None
