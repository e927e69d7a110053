"""The expert: from any page, the next action towards buying the goal's product with the goal's options.

It reads the goal (asin, options), so it is an oracle, for tests, demonstrations and as the env's
`expert_action`: search (with the first of a few queries whose top 50 holds the goal product), page to
the product, open it, click the option value closest to each goal option, buy. Off-track states are
recovered from (`< Prev` out of a wrong item or a sub-page, `Back to Search` from results without the
product).
"""
from __future__ import annotations

import re

from thefuzz import fuzz

from .pages import (BACK_TO_SEARCH, BUY_NOW, DONE, ITEM, ITEM_SUB, NEXT_PAGE, PAGE_SIZE, PREV_PAGE, RESULTS,
                    SEARCH, Session)
from .reward import FUZZ_THRESHOLD, normalize_color

_PRICE_CLAUSE = re.compile(r",? and price lower than [\d.]+ dollars$")


def search_queries(goal: dict) -> list[str]:
    """Candidate queries, most natural first: the instruction without its price clause, the product
    type with the attributes, then the product's name."""
    text = _PRICE_CLAUSE.sub("", goal["instruction_text"]).strip()
    return [q for q in (text, " ".join([goal["query"], *goal["attributes"]]), goal["name"].lower()) if q.strip()]


def oracle_query(session: Session) -> str:
    target = session.goal["asin"]
    queries = search_queries(session.goal)
    for q in queries:
        if target in session.shop.search(" ".join(q.lower().split(" "))):
            return q
    return queries[-1]


def option_clicks(product: dict, goal_options: dict | list) -> dict[str, str]:
    """{option group: value to click} realising the goal's options on `product`."""
    if isinstance(goal_options, dict):
        wanted = [(name.lower(), str(v).lower()) for name, v in goal_options.items()]
    else:
        wanted = [(None, str(v).lower()) for v in goal_options]
    picks: dict[str, str] = {}
    for group, value in wanted:
        groups = [group] if group in product["options"] else list(product["options"])
        best, best_score = None, FUZZ_THRESHOLD
        for g in groups:
            for v in product["options"][g]:
                if v == value:
                    best, best_score = (g, v), 101
                    break
                score = fuzz.token_set_ratio(normalize_color(v), normalize_color(value))
                if score > best_score:
                    best, best_score = (g, v), score
            if best_score == 101:
                break
        if best is not None:
            picks[best[0]] = best[1]
    return picks


def oracle_action(session: Session) -> str | None:
    page, goal = session.page, session.goal
    target = goal["asin"]
    if page == DONE:
        return None
    if page == SEARCH:
        return f"search[{oracle_query(session)}]"
    if page == RESULTS:
        if target in session.page_products():
            return f"click[{target.lower()}]"
        if target in session.results:
            want = session.results.index(target) // PAGE_SIZE + 1
            return f"click[{(NEXT_PAGE if want > session.page_num else PREV_PAGE).lower()}]"
        return f"click[{BACK_TO_SEARCH.lower()}]"
    if page == ITEM_SUB:
        return f"click[{PREV_PAGE.lower()}]"
    if page == ITEM:
        if session.asin != target:
            return f"click[{PREV_PAGE.lower()}]"
        for group, value in option_clicks(session.shop.by_asin[target], goal["goal_options"]).items():
            if session.options.get(group) != value:
                return f"click[{value}]"
        return f"click[{BUY_NOW.lower()}]"
    raise ValueError(f"unknown page {page!r}")
