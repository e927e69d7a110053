"""WebShop's pages and actions: one shopping session as a small state machine.

Pages (as on the WebShop site): **search** (instruction + search box) → **results** (`Back to Search`,
`Page p (Total results: N)`, `< Prev` from page 2, `Next >`, then 10 products of the top 50: asin,
title, price) → **item** (`Back to Search`, `< Prev`, option groups with their values, title, price,
rating, `Description`, `Features`, `Reviews`, `Buy Now`) → **item sub-pages** (`< Prev` back to the
item) → **done** after `Buy Now`.

Actions: `search[keywords]` where the page has a search box, `click[value]` with `value` one of the
page's clickables (lower-cased button texts and product asins, then option values). Anything else
changes nothing and earns 0 (with `invalid_feedback` the observation says why).

Each page is a list of `El` elements in document order; the text observation (WebShop's "simple"
mode: visible strings joined with " [SEP] ") and the web view's HTML are both rendered from it, so
the two always show the same shop.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .shop import Shop

SEARCH, RESULTS, ITEM, ITEM_SUB, DONE = "search", "results", "item", "item_sub", "done"
BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW = "Back to Search", "Next >", "< Prev", "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")
PAGE_SIZE = 10
SEP = " [SEP] "
SEARCH_ACTION_HINT = "search[<your query>]"
_ACTION = re.compile(r"(.+)\[(.+)\]")


@dataclass(frozen=True)
class El:
    """One visible piece of a page. `click` is its clickable name when it can be clicked."""

    kind: str
    text: str = ""
    click: str | None = None
    group: str | None = None      # option group of an "option"
    selected: bool = False        # an option currently chosen (shown by the web view only)


def parse_action(action: str) -> tuple[str, str | None]:
    """`"click[Buy Now]"` → ("click", "Buy Now"); no brackets → (action, None). Same pattern as WebShop."""
    m = _ACTION.match(action)
    return (action, None) if m is None else (m.group(1), m.group(2))


def simple_text(elements: list[El]) -> str:
    return SEP.join(t for t in (e.text.strip() for e in elements) if t)


@dataclass
class StepOutcome:
    reward: float = 0.0
    done: bool = False
    valid: bool = True
    feedback: str = ""
    reward_info: dict | None = None


@dataclass
class Session:
    """One goal being shopped for in `shop` (a `shop.Shop`)."""

    shop: Shop
    goal: dict
    page: str = SEARCH
    keywords: list[str] | None = None
    page_num: int = 1
    results: list[str] = field(default_factory=list)
    asin: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub_page: str | None = None
    visited: set[str] = field(default_factory=set)
    reward: float | None = None
    reward_info: dict | None = None

    # ------------------------------------------------------------------ rendering
    def elements(self) -> list[El]:
        """The current page's elements (cached until the session state changes)."""
        key = (self.page, self.page_num, self.asin, tuple(self.options.items()), self.sub_page,
               tuple(self.results), self.reward)
        if getattr(self, "_view_key", None) != key:
            self._view_key, self._view = key, self._render()
        return self._view

    def _render(self) -> list[El]:
        inst = self.goal["instruction_text"]
        if self.page == SEARCH:
            return [El("logo", "WebShop"), El("instruction_label", "Instruction:"), El("instruction", inst),
                    El("search_box"), El("button", "Search", click="search")]
        head = [El("instruction_label", "Instruction:"), El("instruction", inst),
                El("button", BACK_TO_SEARCH, click=BACK_TO_SEARCH.lower())]
        if self.page == RESULTS:
            els = head + [El("page_info", f"Page {self.page_num} (Total results: {len(self.results)})")]
            if self.page_num > 1:
                els.append(El("button", PREV_PAGE, click=PREV_PAGE.lower()))
            els.append(El("button", NEXT_PAGE, click=NEXT_PAGE.lower()))
            for asin in self.page_products():
                p = self.shop.by_asin[asin]
                els += [El("product_link", asin, click=asin.lower()), El("product_title", p["Title"]),
                        El("product_price", p["Price"])]
            return els
        if self.page == ITEM:
            assert self.asin is not None                  # item pages show the opened product
            p = self.shop.by_asin[self.asin]
            els = head + [El("button", PREV_PAGE, click=PREV_PAGE.lower())]
            for name, values in p["options"].items():
                els.append(El("option_name", name))
                els += [El("option", v, click=v, group=name, selected=self.options.get(name) == v) for v in values]
            els += [El("item_title", p["Title"]), El("item_price", f"Price: {p['Price']}"),
                    El("item_rating", f"Rating: {p['Rating']}")]
            els += [El("button", s, click=s.lower()) for s in SUB_PAGES]
            els.append(El("button", BUY_NOW, click=BUY_NOW.lower()))
            return els
        if self.page == ITEM_SUB:
            assert self.asin is not None                  # item pages show the opened product
            p = self.shop.by_asin[self.asin]
            els = head + [El("button", PREV_PAGE, click=PREV_PAGE.lower())]
            if self.sub_page == "Description":
                els.append(El("content", p["Description"]))
            elif self.sub_page == "Features":
                els += [El("content", b) for b in p["BulletPoints"]]
            else:
                for r in p["Reviews"]:
                    els += [El("review_title", f'"{r.get("title", "")}"'), El("review_score", str(r.get("score", ""))),
                            El("review_body", r.get("body", ""))]
            return els
        # DONE. Deviation: WebShop's done page also prints (hidden in a browser, visible in text mode)
        # the MTurk code and the purchase/goal records; here it shows the purchase and the score.
        return [El("done", "Thank you for shopping with us!"), El("done_label", "Purchased"),
                El("done_asin", self.asin or ""), El("done_options", json.dumps(self.options)),
                El("done_label", "Your score (min 0.0, max 1.0)"), El("done_score", str(self.reward))]

    def text(self) -> str:
        return simple_text(self.elements())

    def page_products(self) -> list[str]:
        return self.results[(self.page_num - 1) * PAGE_SIZE: self.page_num * PAGE_SIZE]

    def clickables(self) -> list[str]:
        """WebShop's order: buttons and product links in page order, then option values."""
        els = self.elements()
        names = [e.click for e in els if e.click is not None and e.kind != "option"]
        names += [e.click for e in els if e.click is not None and e.kind == "option"]
        return list(dict.fromkeys(names))

    @property
    def has_search_bar(self) -> bool:
        return self.page == SEARCH

    def available_actions(self) -> dict:
        """WebShop's `get_available_actions()`: {"has_search_bar": bool, "clickables": [...]}."""
        return {"has_search_bar": self.has_search_bar, "clickables": self.clickables()}

    def admissible_actions(self) -> list[str]:
        acts = [SEARCH_ACTION_HINT] if self.has_search_bar else []
        return acts + [f"click[{c}]" for c in self.clickables() if c != "search"]

    # ------------------------------------------------------------------ actions
    def step(self, action: str) -> StepOutcome:
        if self.page == DONE:
            return StepOutcome(valid=False, done=True, feedback="the purchase is over")
        name, arg = parse_action(action.strip())
        arg = arg.lower() if arg is not None else None
        if name == "search" and arg:
            if not self.has_search_bar:
                return StepOutcome(valid=False, feedback="there is no search box on this page; "
                                   "click[back to search] first")
            self._search(arg.split(" "))
            return StepOutcome()
        if name == "click" and arg is not None:
            clickables = self.clickables()
            if arg in clickables and arg != "search":
                return self._click(arg)
            shown = ", ".join(c for c in clickables if c != "search") or "none"
            return StepOutcome(valid=False, feedback=f'"{arg}" is not clickable on this page (clickable: {shown})')
        return StepOutcome(valid=False, feedback='actions are search[keywords] or click[value]')

    def _search(self, keywords: list[str], page_num: int = 1) -> None:
        self.keywords, self.page_num, self.page = keywords, page_num, RESULTS
        self.results = self.shop.search(" ".join(keywords))
        self.asin, self.options, self.sub_page = None, {}, None

    def _click(self, arg: str) -> StepOutcome:
        page = self.page
        if arg == BUY_NOW.lower():
            assert self.asin is not None                  # Buy Now is only on an item page
            self.reward, self.reward_info = self.shop.reward(self.goal, self.asin, self.options)
            self.page = DONE
            return StepOutcome(reward=self.reward, done=True, reward_info=self.reward_info)
        if arg == BACK_TO_SEARCH.lower():
            self.page, self.keywords, self.page_num, self.results = SEARCH, None, 1, []
            self.asin, self.options, self.sub_page, self.visited = None, {}, None, set()
        elif arg == NEXT_PAGE.lower() and page == RESULTS:
            self.page_num += 1
        elif arg == PREV_PAGE.lower() and page == RESULTS:
            self.page_num -= 1
        elif arg == PREV_PAGE.lower() and page == ITEM_SUB:
            self.page, self.sub_page = ITEM, None
        elif arg == PREV_PAGE.lower() and page == ITEM:
            self._search(self.keywords or [], self.page_num)
        elif arg in {s.lower() for s in SUB_PAGES}:
            self.page, self.sub_page = ITEM_SUB, next(s for s in SUB_PAGES if s.lower() == arg)
        else:
            self._open_item_or_option(arg)
        return StepOutcome()

    def _open_item_or_option(self, arg: str) -> None:
        # WebShop maps clickable names to elements in a dict filled with buttons and links first, then
        # option values: an option value that equals another clickable's name wins.
        same = [e for e in self.elements() if e.click == arg]
        el = next((e for e in same if e.kind == "option"), same[-1])
        if el.kind == "product_link":
            self.asin = el.text.upper()
            self.visited.add(self.asin)
        elif el.kind == "option":
            assert el.group is not None and el.click is not None      # every option El has both
            self.options[el.group] = el.click
        self.page = ITEM

