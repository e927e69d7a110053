"""Memoised parsing for textworld's PDDL engine: the step-time patch for ALFWorld.

Every ALFWorld step renders its feedback and each admissible command through textworld's
context-sensitive grammar, and `ContextSensitiveGrammar.derive` re-parses the same few dozen
template strings with TatSu each time (`textworld.envs.pddl.textgen._parse_and_convert`); the
grammar's conditions do the same with logic queries (`textworld.logic._parse_and_convert`,
rule "conjunctiveQuery"). The parses are pure functions of (text, rule name), so this module
memoises them, handing every caller a deep copy because the engine mutates what it gets
(`ListSymbol.derive` sets `.context` on nested symbols). Only rules that build values are
memoised; document rules with side effects on a logic object pass straight through.

A second, independent memo covers resets: `PddlEnv.load()` and every `PddlEnv.reset()` run
Fast Downward's PDDL→SAS translator twice on the same (domain, problem) (≈0.5–1 s). The
translation is a pure function of its inputs, so `fast_downward.pddl2sas` is memoised in a small
LRU; resetting a game that was played before then costs ≈50 ms. The translator also overwrites
`sys.argv`; the wrapper restores it.

Both patches are installed when `agentq.envs.alfworld.env` is imported (set
`AGENTQ_ALFWORLD_PARSE_CACHE=0` to skip), can be removed with `uninstall()`, and are checked by
the tests against the unpatched engine for byte-identical observations and admissible commands.
The patched functions are private to textworld, so the patch is tied to the versions it was
verified on (`TESTED_VERSIONS`); other versions get a warning, and the identity test decides.
"""
from __future__ import annotations

import copy
import hashlib
import sys
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable

TESTED_VERSIONS = {"textworld": ("1.7.0",), "fast_downward_textworld": ("20.6.4",)}
_TEXTGEN_RULES = frozenset({"symbols"})
#: problems of this name are translated without being kept (the planner expert's reduced problems)
ONE_OFF_PROBLEM = "agentq_reduced"
_LOGIC_RULES = frozenset({"conjunctiveQuery", "onlyVariable", "onlySignature", "onlyProposition",
                          "onlyPlaceholder", "onlyPredicate", "onlyRule", "onlyAction"})


class _ParseMemo:
    """Wraps a `_parse_and_convert(text, rule_name=...)`; returns deep copies of cached results."""

    def __init__(self, original: Callable, rules: frozenset[str], maxsize: int = 20_000):
        self.original, self.rules, self.maxsize = original, rules, maxsize
        self.cache: dict[tuple[str, str], object] = {}
        self.hits = self.misses = 0

    def __call__(self, *args, **kwargs):
        text = args[0] if args else kwargs.get("text")
        rule = kwargs.get("rule_name")
        extra = {k: v for k, v in kwargs.items() if k != "rule_name"}
        if (len(args) != 1 or not isinstance(text, str) or rule not in self.rules
                or any(extra.values())):          # e.g. trace=True: leave debugging runs alone
            return self.original(*args, **kwargs)
        key = (text, rule)
        try:
            hit = self.cache[key]
            self.hits += 1
        except KeyError:
            self.misses += 1
            hit = self.original(*args, **kwargs)
            if len(self.cache) < self.maxsize:
                self.cache[key] = hit
        return copy.deepcopy(hit)


class _TranslationMemo:
    """Wraps `fast_downward.pddl2sas(domain, problem, verbose, optimize)` in an LRU."""

    def __init__(self, original: Callable, maxsize: int = 16):   # ≈2 MB per game
        self.original, self.maxsize = original, maxsize
        self.cache: OrderedDict[tuple[str, bool], tuple] = OrderedDict()
        self.hits = self.misses = 0

    def __call__(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False):
        if f"(problem {ONE_OFF_PROBLEM})" in problem[:200]:     # the planner's reduced problems: never seen twice
            return self._translate(domain, problem, verbose, optimize)
        key = (hashlib.sha256(f"{len(domain)}:{domain}{problem}".encode()).hexdigest(), bool(optimize))
        if key in self.cache and not verbose:
            self.hits += 1
            self.cache.move_to_end(key)
            return self.cache[key]
        self.misses += 1
        result = self.cache[key] = self._translate(domain, problem, verbose, optimize)
        while len(self.cache) > self.maxsize:
            self.cache.popitem(last=False)
        return result

    def _translate(self, domain, problem, verbose, optimize):
        argv = list(sys.argv)       # the translator overwrites sys.argv
        try:
            return self.original(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv[:] = argv


_memos: dict[str, tuple[Any, str, Any]] = {}   # name → (module, attribute, memo); memos outlive uninstall
_installed: set[str] = set()


def _targets():
    import fast_downward
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as logic
    return {"textgen": (textgen, "_parse_and_convert", lambda f: _ParseMemo(f, _TEXTGEN_RULES)),
            "logic": (logic, "_parse_and_convert", lambda f: _ParseMemo(f, _LOGIC_RULES)),
            "translation": (fast_downward, "pddl2sas", _TranslationMemo)}


def _check_versions() -> None:
    from importlib.metadata import PackageNotFoundError, version
    for pkg, ok in TESTED_VERSIONS.items():
        try:
            v = version(pkg)
        except PackageNotFoundError:
            continue
        if v not in ok:
            warnings.warn(f"agentq's ALFWorld parse cache was verified on {pkg} {ok}, found {v}: "
                          "run tests/envs/test_alfworld.py (output identity) before trusting it", stacklevel=3)


def install(parse: bool = True, translation: bool = True) -> None:
    """Install the memos (idempotent). `parse`: TatSu template/query parses; `translation`: PDDL→SAS."""
    wanted = {"textgen": parse, "logic": parse, "translation": translation}
    if not _memos:
        _check_versions()
        for name, (module, attr, make) in _targets().items():
            _memos[name] = (module, attr, make(getattr(module, attr)))
    for name, (module, attr, memo) in _memos.items():
        if wanted[name] and name not in _installed:
            setattr(module, attr, memo)
            _installed.add(name)


def uninstall(parse: bool = True, translation: bool = True) -> None:
    """Restore textworld's and fast_downward's own functions (the memos keep their contents)."""
    wanted = {"textgen": parse, "logic": parse, "translation": translation}
    for name in [n for n in _installed if wanted[n]]:
        module, attr, memo = _memos[name]
        setattr(module, attr, memo.original)
        _installed.discard(name)


def installed() -> dict[str, bool]:
    return {"parse": "textgen" in _installed, "translation": "translation" in _installed}


def clear() -> None:
    """Empty the memos (their hit/miss counters too)."""
    for _, _, memo in _memos.values():
        memo.cache.clear()
        memo.hits = memo.misses = 0


def stats() -> dict[str, dict[str, int]]:
    """Hit/miss counts and sizes of the memos (for benchmarks)."""
    return {name: {"hits": memo.hits, "misses": memo.misses, "entries": len(memo.cache),
                   "installed": name in _installed}
            for name, (_, _, memo) in _memos.items()}


@contextmanager
def disabled(parse: bool = True, translation: bool = True):
    """Run a block on the unpatched engine (e.g. to record reference transcripts), then restore."""
    before = installed()
    uninstall(parse=parse, translation=translation)
    try:
        yield
    finally:
        install(parse=before["parse"], translation=before["translation"])
