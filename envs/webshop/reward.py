"""WebShop's purchase reward, reimplemented from its published definition (Yao et al., 2022).

With A = goal attributes and O = goal options:

    r = r_type * (|A matched| + |O matched| + [price <= price_upper]) / (|A| + |O| + 1)

* An attribute is matched when some product attribute has `token_set_ratio > 85` with it, or when the
  goal attribute occurs in the lower-cased title, bullet points or description.
* An option is matched when some selected option value has `token_set_ratio > 85` with it, both
  passed through `normalize_color` first (the first colour word found wins).
* `r_type` compares the product types: 1.0 when the query is the same, or at least two category levels
  are shared, or the title-noun overlap is > 0.2; else 0.5; then 0.1 when the overlap is < 0.1 and
  0.0 when it is 0.

Fuzzy matching is `thefuzz.fuzz.token_set_ratio`, the library WebShop itself calls, so option and
attribute matches agree with the original one for one. Synthetic goals keep their options as a
dict and WebShop scores them as `(name, value)` pairs; passing the same pairs through the same
library reproduces that behaviour too.

Deviation (stated): WebShop finds the title nouns with spaCy's `en_core_web_sm` tagger (NOUN/PROPN).
spaCy and its model are not available offline, so the default `noun_tagger="heuristic"` keeps every
alphanumeric word of the name that is not a closed-class word (determiner, preposition, pronoun,
conjunction, auxiliary) or a number. Amazon titles are title-cased, which spaCy mostly tags PROPN,
so the two agree on most words; they can differ on adjectives. `noun_tagger="spacy"` uses spaCy when
it and the model are installed.
"""
from __future__ import annotations

import functools
import re
from typing import Any, Callable, Iterable

from thefuzz import fuzz

from agentq.utils.errors import first_line

from .search import split_words

#: Colour words, alphabetical: `normalize_color` maps a value to the first of these it contains,
#: the same vocabulary (and so the same first match) as WebShop's reward.
COLOR_WORDS: tuple[str, ...] = tuple("""
alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy
camel camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral
cranberry cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass
gray green grey heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon
mauve merlot midnight mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter
pink plum purple rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone
stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow
""".split())

FUZZ_THRESHOLD = 85
#: a price_upper of this or more means "no price limit" (WebShop uses 1,000,000 and no price text)
NO_PRICE_LIMIT = 1_000_000


def normalize_color(value: Any) -> Any:
    """The first colour word contained in `value`, else `value` unchanged.

    `in` is substring search for a string and element search for a tuple (a synthetic goal's
    (name, value) pair), exactly as in WebShop.
    """
    for color in COLOR_WORDS:
        if color in value:
            return color
    return value


def fuzzy_match(a: Any, b: Any) -> bool:
    return fuzz.token_set_ratio(a, b) > FUZZ_THRESHOLD


# ---------------------------------------------------------------------------------------- type
_CLOSED_CLASS = frozenset("""
a an the this that these those some any each every either neither no all both few many much more most
other another such own same and or but nor so yet if than as because while although though whether
of in on at by for with without about against between into through during before after above below to
from up down out off over under again further then once per via within along across behind beyond
toward towards upon onto among around near plus
i me my mine we us our ours you your yours he him his she her hers it its they them their theirs
what which who whom whose where when why how
is are was were be been being am do does did have has had having can could will would shall should
may might must not only very too just also
""".split())
_WORD = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?")


def heuristic_nouns(name: str) -> list[str]:
    """Lower-cased words of `name` that are taken as nouns (see the module docstring)."""
    return [t for t in split_words(name, _WORD) if t not in _CLOSED_CLASS and any(c.isalpha() for c in t)]


@functools.lru_cache(maxsize=1)
def _spacy_model():
    try:
        import spacy
        return spacy.load("en_core_web_sm")
    except Exception as e:  # ImportError, or OSError when the model is missing
        # a ValueError (a refused setting), raised when the shop is built: it was a RuntimeError at the
        # first `Buy Now`, so every episode that bought something was lost mid-run
        raise ValueError(
            f"noun_tagger='spacy' needs `pip install spacy` and the en_core_web_sm model ({type(e).__name__}: "
            f"{first_line(e)}); valid noun_tagger values: ['heuristic', 'spacy']") from None


def spacy_nouns(name: str) -> list[str]:
    return [t.text.lower() for t in _spacy_model()(name) if t.pos_ in ("NOUN", "PROPN")]


NOUN_TAGGERS: dict[str, Callable[[str], list[str]]] = {"heuristic": heuristic_nouns, "spacy": spacy_nouns}


def noun_tagger(name: str) -> Callable[[str], list[str]]:
    """The tagger `name` names, ready to use (spaCy's model is loaded here, so a missing one is refused
    when the shop is built, not at an episode's first purchase)."""
    if name not in NOUN_TAGGERS:
        raise ValueError(f"unknown noun_tagger {name!r}; valid: {sorted(NOUN_TAGGERS)}")
    if name == "spacy":
        _spacy_model()
    return NOUN_TAGGERS[name]


def _category_levels(path: str) -> set[str]:
    return {x.strip() for x in path.split("›")}


def type_reward(product: dict, goal: dict, nouns: Callable[[str], list[str]] = heuristic_nouns) -> dict:
    query_match = product["query"] == goal["query"]
    category_match = len(_category_levels(product["product_category"]) & _category_levels(goal["product_category"])) >= 2
    bought = set(nouns(product["name"]))
    wanted = nouns(goal["name"])
    # the overlap counts distinct shared nouns against all (possibly repeated) goal nouns
    title_score = 0.2 if not wanted else len(bought & set(wanted)) / len(wanted)
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return dict(r_type=r_type, query_match=query_match, category_match=category_match, title_score=title_score)


# ---------------------------------------------------------------------------------------- terms
def attribute_matches(product: dict, goal_attributes: Iterable[str]) -> int:
    title = product["Title"].lower()
    bullets = " ".join(product["BulletPoints"]).lower()
    desc = product["Description"].lower()
    n = 0
    for g in goal_attributes:
        if any(fuzzy_match(p, g) for p in product["Attributes"]) or g in title or g in bullets or g in desc:
            n += 1
    return n


def option_matches(selected_values: Iterable[Any], goal_options: Iterable[Any]) -> int:
    chosen = [normalize_color(o) for o in selected_values]
    n = 0
    for g in (normalize_color(o) for o in goal_options):
        if any(fuzzy_match(p, g) for p in chosen):
            n += 1
    return n


def goal_option_items(goal_options: dict | list) -> list:
    """What WebShop scores a goal's options as: (name, value) pairs for a dict, the strings for a list."""
    return list(goal_options.items()) if isinstance(goal_options, dict) else list(goal_options)


def compute_reward(product: dict, goal: dict, price: float, options: dict[str, str],
                   nouns: Callable[[str], list[str]] = heuristic_nouns) -> tuple[float, dict]:
    """(reward, sub-scores) for buying `product` at `price` with the selected `options` {name: value}."""
    t = type_reward(product, goal, nouns)
    n_att, n_opt = len(goal["attributes"]), len(goal["goal_options"])
    denom = n_att + n_opt + 1
    r_price = (price <= goal["price_upper"]) if goal["price_upper"] > 0 else None
    att = attribute_matches(product, goal["attributes"])
    opt = option_matches(list(options.values()), goal_option_items(goal["goal_options"]))
    reward = (att + opt + bool(r_price)) / denom * t["r_type"]
    info = dict(r_type=t["r_type"], r_att=att / n_att if n_att else None, w_att=n_att / denom,
                query_match=t["query_match"], category_match=t["category_match"], title_score=t["title_score"],
                attributes_matched=att, options_matched=opt)
    if n_opt:
        info.update(r_option=opt / n_opt, w_option=n_opt / denom)
    if r_price is not None:
        info.update(r_price=bool(r_price), w_price=1 / denom)
    return reward, info
