"""A deterministic, seeded product catalog in WebShop's real file format.

`generate_catalog(num_products, seed, goals_per_product)` returns a `RawData` (product records as in
`items_shuffle*.json`, attributes and one synthetic instruction per product as in `items_ins_v2*.json`,
human-style instructions as in `items_human_ins.json`), so everything downstream (normalisation, goals,
search, pages, reward) runs exactly as on the real files.

Products come from product *types* (`TYPES`): each has a search query, a category path, name nouns, an
attribute pool and option groups. A catalog spreads `num_products` over all types, so every goal has
many distractors:

* same-type products (same query, same category): other attribute subsets, other option values, other
  prices; buying one usually loses attributes, options or the price term;
* sibling types that share name nouns and category levels (men's and women's running shoes, shoe
  racks; shampoo and hair oil; wireless earbuds and wireless headphones), which the search engine
  returns for the same keywords.

Vocabularies are chosen so that no two attributes of a pool and no two values of an option group match
each other under the reward's fuzzy rule (`tests/envs/test_webshop.py` checks it), so choosing the item
and the options both change the reward.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from .data import RawData

CATEGORY_ROOTS = {
    "beauty": "Beauty & Personal Care",
    "food": "Grocery & Gourmet Food",
    "fashion": "Clothing, Shoes & Jewelry",
    "furniture": "Home & Kitchen",
    "electronics": "Electronics",
}


@dataclass(frozen=True)
class ProductType:
    category: str                 # one of CATEGORY_ROOTS
    query: str                    # the product's `query` field, and the noun phrase of its instructions
    path: str                     # category levels below the root, "A › B › C"
    nouns: tuple[str, ...]        # name heads, title case
    attributes: tuple[str, ...]   # attribute pool (lower case, as in items_ins_v2)
    options: tuple[tuple[str, tuple[str, ...]], ...]   # (option name, values) as shown on the site
    price: tuple[float, float]    # price range of the type


def _t(category, query, path, nouns, attributes, options, price):
    return ProductType(category, query, path, tuple(nouns.split("|")), tuple(attributes.split("|")),
                       tuple((name, tuple(values.split("|"))) for name, values in options), price)


def _load_types() -> tuple[ProductType, ...]:
    """The product types, from `product_types.json` beside this file ("|" separates values there)."""
    rows = json.loads(Path(__file__).with_name("product_types.json").read_text(encoding="utf-8"))["types"]
    return tuple(_t(r["category"], r["query"], r["path"], r["nouns"], r["attributes"], r["options"],
                    tuple(r["price"])) for r in rows)


TYPES: tuple[ProductType, ...] = _load_types()

BRAND_PARTS = ("Alder Birch Cedar Dune Elm Fern Glen Harbor Iris Juniper Kestrel Linden Maple North Oak Pine Quill "
               "Ridge Summit Thistle Umber Vale Willow Yarrow Zephyr").split()
BRAND_TAILS = "brook field wood stone crest line ware craft works co lab home".split()
GENERIC_BULLETS = (
    "Designed for everyday use at home, at work and on the go",
    "Backed by a 30-day satisfaction guarantee from our support team",
    "Packed with care in recyclable packaging",
    "Thousands of customers choose it again and again",
)
INSTRUCTION_TEMPLATES = (
    "i need {attrs} {noun}{options}",
    "i am looking for {attrs} {noun}{options}",
    "i'm looking for {noun} that is {attrs}{options}",
    "find me {attrs} {noun}{options}",
    "i want to buy {noun} which is {attrs}{options}",
    "looking for {attrs} {noun}{options}",
)


def _join_and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _option_clause(chosen: list[tuple[str, str]], rng: random.Random) -> str:
    if not chosen:
        return ""
    if rng.random() < 0.5:
        return " with " + " and ".join(f"{name}: {value}" for name, value in chosen)
    return ", " + " and ".join(f"{value} {name}" if name in ("color", "scent", "flavor name") else f"{name} {value}"
                               for name, value in chosen)


def _asin(rng: random.Random, used: set[str]) -> str:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    while True:
        asin = "B0" + "".join(rng.choice(alphabet) for _ in range(8))
        if asin not in used:
            used.add(asin)
            return asin


def _price(lo: float, hi: float, rng: random.Random) -> float:
    return round(rng.uniform(lo, hi), 0) - 0.01


def _product(t: ProductType, asin: str, rng: random.Random) -> tuple[dict, list[str]]:
    attrs = rng.sample(t.attributes, rng.randint(3, min(5, len(t.attributes))))
    brand = rng.choice(BRAND_PARTS) + rng.choice(BRAND_TAILS)
    noun = rng.choice(t.nouns)
    title_attrs = [a.title() for a in attrs[: rng.randint(1, 2)]]
    extra = rng.choice(("", "", f", {attrs[-1].title()}", " for Everyday Use", " - Value Pack"))
    name = f"{brand} {' '.join(title_attrs)} {noun}{extra}".replace("  ", " ")
    options = {}
    for opt_name, values in t.options:
        k = rng.randint(min(2, len(values)), len(values))
        picked = sorted(rng.sample(range(len(values)), k))
        options[opt_name.title()] = [{"value": values[i], "image": None} for i in picked]
    lo, hi = t.price
    if rng.random() < 0.3:
        a, b = sorted((_price(lo, hi, rng), _price(lo, hi, rng)))
        b = max(b, a + 2)
        pricing = f"${a:.2f} - ${b:.2f}"
    else:
        pricing = f"${_price(lo, hi, rng):.2f}"
    bullets = [f"{a.capitalize()}: one of the reasons to choose this {noun.lower()}" for a in attrs]
    bullets.append(rng.choice(GENERIC_BULLETS))
    description = (f"The {brand} {noun.lower()} is {_join_and(attrs[:2])}. "
                   f"{rng.choice(GENERIC_BULLETS)}.")
    record = {
        "asin": asin,
        "name": name,
        "full_description": description,
        "small_description": bullets,
        "pricing": pricing,
        "list_price": "",
        "customization_options": options or None,
        "images": [],
        "category": t.category,
        "query": t.query,
        "product_category": f"{CATEGORY_ROOTS[t.category]} › {t.path}",
        "brand": brand,
        "brand_url": "",
        "average_rating": round(rng.uniform(3.0, 5.0), 1),
        "total_reviews": rng.randint(0, 2000),
        "total_answered_questions": rng.randint(0, 40),
        "availability_status": "In Stock.",
        "availability_quantity": None,
        "product_information": {},
        "seller_id": "", "seller_name": "", "fulfilled_by_amazon": bool(rng.random() < 0.5),
        "fast_track_message": "", "aplus_present": False, "small_description_old": "",
    }
    return record, attrs


#: redraws of a goal that repeats an earlier goal of its product (a product with fewer distinct
#: goals than `goals_per_product` keeps the repeat)
REDRAWS = 20


def _human_instruction(t: ProductType, attrs: list[str], options: dict, rng: random.Random):
    ins_attrs = rng.sample(attrs, rng.randint(1, min(3, len(attrs))))
    chosen = [(name.lower(), rng.choice(vals)["value"].lower()) for name, vals in options.items()]
    text = rng.choice(INSTRUCTION_TEMPLATES).format(attrs=_join_and(ins_attrs), noun=t.query,
                                                    options=_option_clause(chosen, rng))
    return text, ins_attrs, [v for _, v in chosen]


def _human_instructions(t: ProductType, asin: str, attrs: list[str], options: dict, n: int,
                        rng: random.Random) -> list[dict]:
    out: list[dict] = []
    seen: set[tuple] = set()
    for _ in range(n):
        text, ins_attrs, values = _human_instruction(t, attrs, options, rng)
        # Independent draws can repeat a goal of the same product; the shuffled split would then put
        # one task in two splits (train and dev). A repeat is redrawn from its own generator, so
        # `rng`'s stream, and with it every other product and goal (and each task id's goal), stays
        # what it was.
        side = random.Random(f"{asin}/{len(out)}")
        for _ in range(REDRAWS):
            if (text, tuple(ins_attrs), tuple(values)) not in seen:
                break
            text, ins_attrs, values = _human_instruction(t, attrs, options, side)
        seen.add((text, tuple(ins_attrs), tuple(values)))
        out.append({"asin": asin, "instruction": text, "attributes": ins_attrs, "options": values,
                    "instruction_attributes": ins_attrs, "instruction_options": values,
                    "assignment_id": f"gen-{asin}-{len(out)}", "worker_id": "generated"})
    return out


def generate_catalog(num_products: int = 1000, seed: int = 0, goals_per_product: int = 3) -> RawData:
    """A catalog of `num_products` products spread evenly over `TYPES`, deterministic in `seed`."""
    if num_products < len(TYPES):
        raise ValueError(f"num_products must be at least {len(TYPES)} (one per product type), got {num_products}")
    rng = random.Random(seed)
    used: set[str] = set()
    products, attributes, human = [], {}, {}
    for i in range(num_products):
        t = TYPES[i % len(TYPES)]
        asin = _asin(rng, used)
        record, attrs = _product(t, asin, rng)
        products.append(record)
        ins_attrs = rng.sample(attrs, min(len(attrs), rng.randint(2, 3)))
        attributes[asin] = {"attributes": attrs,
                            "instruction": f"Find me {', '.join(ins_attrs)} {t.query}",
                            "instruction_attributes": ins_attrs}
        human[asin] = _human_instructions(t, asin, attrs, record["customization_options"] or {},
                                          goals_per_product, rng)
    rng.shuffle(products)   # items_shuffle: the file's order carries no type order
    return RawData(products=products, attributes=attributes, human_instructions=human)
