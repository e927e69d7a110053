"""textworld's interned logic objects, let go between games.

textworld builds every `Signature` and `Proposition` through a memoizing metaclass (the `mementos`
package): one process-wide dict, `mementos.core._memento_cache`, keeps each one ever built, keyed by its
value, and nothing ever removes one. An ALFWorld game's propositions name its own objects
(`apple_bar__minus_00_dot_47...`), so each new game adds its own, about 0.85 MB, and an env worker that
plays thousands of games grows by gigabytes (~2.5 GB after the 3,000 games of `gen_train`). These
objects compare and hash by value, so emptying the dict changes no result, only which equal objects
are one: the env empties it when it loads another game (`forget_interned`), and a worker's memory
then stays at about one game's objects.
"""
from __future__ import annotations


def _cache() -> dict | None:
    try:
        from mementos import core
    except ImportError:         # another textworld that does not intern through mementos
        return None
    cache = getattr(core, "_memento_cache", None)
    return cache if isinstance(cache, dict) else None


def interned_count() -> int:
    """How many logic objects textworld holds interned now (0 where it interns none)."""
    cache = _cache()
    return len(cache) if cache is not None else 0


def forget_interned() -> int:
    """Let textworld's interned logic objects go (those still in use stay alive where they are used).

    Returns:
        The number of entries dropped.
    """
    cache = _cache()
    if cache is None:
        return 0
    dropped = len(cache)
    cache.clear()
    return dropped


__all__ = ["forget_interned", "interned_count"]
