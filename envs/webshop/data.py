"""WebShop's data: product records in the real file format, their normalisation, and goals.

Three files make a WebShop data set (the names WebShop's `setup.sh` downloads):

* `items_shuffle_1000.json` / `items_shuffle.json`: a JSON list of product records
  `{asin, name, full_description, small_description, pricing: "$a" | "$a - $b", customization_options:
  {Name: [{value, image}]} | null, images, category, query, product_category: "A › B › C", ...}`;
* `items_ins_v2_1000.json` / `items_ins_v2.json`: `{asin: {attributes: [...], instruction?: str,
  instruction_attributes?: [...]}}` (product attributes, and one synthetic instruction per product);
* `items_human_ins.json`: `{asin: [{asin, instruction, instruction_attributes, instruction_options,
  ...}, ...]}` (the human-written instructions).

`normalize_products` turns records into the product dicts the pages and the reward read (`Title`,
`Description`, `BulletPoints`, `pricing` floats, `Price` tag, lower-cased `options`, `Attributes`, ...)
the way WebShop's loader does; `build_goals` builds goals the way WebShop does (human or synthetic,
price upper bound from the next multiples of ten above the price, list shuffled with seed 233).
`load_data_dir` reads a folder of real files (`WEBSHOP_DATA`); `catalog.generate_catalog` makes a
seeded catalog in the same format, so both go through the same code from here on.
"""
from __future__ import annotations

import itertools
import json
import os
import random
import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

GOAL_SHUFFLE_SEED = 233
PRICE_STEPS = [10.0 * i for i in range(1, 100)]
DEFAULT_PRICE = 100.0
DATA_ENV_VAR = "WEBSHOP_DATA"
#: file names per data variant: (products, attributes); the human instructions file is shared
DATA_FILES = {
    "1000": ("items_shuffle_1000.json", "items_ins_v2_1000.json"),
    "full": ("items_shuffle.json", "items_ins_v2.json"),
}
HUMAN_FILE = "items_human_ins.json"


class WebShopDataError(FileNotFoundError, ValueError):
    """WebShop's data files are not where data_dir / $WEBSHOP_DATA says.

    Also a `ValueError`: a refusal of the env's settings, which `agentq eval` reports as one line
    naming the split (a `FileNotFoundError` alone ended the command with a traceback).
    """


@dataclass
class RawData:
    """The three files' contents, before normalisation."""

    products: list[dict]
    attributes: dict[str, dict]
    human_instructions: dict[str, list[dict]] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ products
def parse_pricing(pricing: Any) -> tuple[list[float], str]:
    """`"$12.99"` → ([12.99], "$12.99"); `"$5.50 - $9.00"` → ([5.5, 9.0], "$5.5 to $9.0"); empty → $100."""
    if not pricing:
        return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
    if isinstance(pricing, (int, float)):
        values = [float(pricing)]
    elif isinstance(pricing, list):
        values = [float(Decimal(re.sub(r"[^\d.]", "", str(p)))) for p in pricing]
    else:
        values = [float(Decimal(re.sub(r"[^\d.]", "", piece))) for piece in str(pricing).split("$")[1:]]
    if not values:
        return [DEFAULT_PRICE], f"${DEFAULT_PRICE}"
    if len(values) == 1:
        return values, f"${values[0]}"
    return values[:2], f"${values[0]} to ${values[1]}"


def normalize_options(customization_options: dict | None) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Option names lower-cased; values stripped, '/' → ' | ', lower-cased (as WebShop shows them)."""
    options: dict[str, list[str]] = {}
    images: dict[str, Any] = {}
    for name, contents in (customization_options or {}).items():
        if contents is None:
            continue
        values = []
        for content in contents:
            value = content["value"].strip().replace("/", " | ").lower()
            values.append(value)
            images[value] = content.get("image")
        options[name.lower()] = values
    return options, images


def normalize_products(raw: RawData, human_goals: bool = True, num_products: int | None = None) -> list[dict]:
    """Product dicts as WebShop's pages and reward read them (one per distinct valid asin)."""
    records = raw.products[:num_products] if num_products is not None else raw.products
    seen: set[str] = set()
    out = []
    for p in records:
        asin = p["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        pricing, price_tag = parse_pricing(p.get("pricing"))
        options, option_to_image = normalize_options(p.get("customization_options"))
        bullets = p.get("small_description")
        bullets = bullets if isinstance(bullets, list) else [bullets or ""]
        attrs = raw.attributes.get(asin, {})
        prod = {
            "asin": asin,
            "name": p["name"],
            "Title": p["name"],
            "category": p["category"],
            "query": p["query"].lower().strip(),
            "product_category": p["product_category"],
            "Description": p.get("full_description") or "",
            "BulletPoints": bullets,
            "pricing": pricing,
            "Price": price_tag,
            "options": options,
            "option_to_image": option_to_image,
            "Attributes": attrs["attributes"] if "attributes" in attrs else ["DUMMY_ATTR"],
            "MainImage": (p.get("images") or [None])[0],
            # WebShop's loader never reads its reviews file: every item page shows "Rating: N.A."
            # and an empty Reviews page. Kept so the pages match.
            "Reviews": [],
            "Rating": "N.A.",
        }
        if human_goals:
            if asin in raw.human_instructions:
                prod["instructions"] = raw.human_instructions[asin]
        else:
            prod["instruction_text"] = attrs.get("instruction")
            prod["instruction_attributes"] = attrs.get("instruction_attributes")
        out.append(prod)
    return out


def product_prices(products: list[dict], rng: random.Random) -> dict[str, float]:
    """The price each product sells at: its single price, or a uniform draw in its price range."""
    prices = {}
    for p in products:
        pricing = p["pricing"]
        prices[p["asin"]] = pricing[0] if len(pricing) == 1 else rng.uniform(*pricing[:2])
    return prices


# ------------------------------------------------------------------------------------ goals
def price_upper_for(price: float, rng: random.Random) -> tuple[float, str]:
    """The larger of two distinct draws among the next four multiples of 10 above `price`."""
    steps = [p for p in PRICE_STEPS if p > price][:4]
    if len(steps) < 2:
        return 1_000_000, ""
    upper = sorted(rng.sample(steps, 2))[1]
    return upper, f", and price lower than {upper:.2f} dollars"


def _goal(product: dict, instruction_text: str, attributes: list, options: dict | list, price_upper: float) -> dict:
    return {
        "asin": product["asin"], "category": product["category"], "query": product["query"],
        "name": product["Title"], "product_category": product["product_category"],
        "instruction_text": instruction_text, "attributes": list(attributes), "price_upper": price_upper,
        "goal_options": options,
    }


def human_goals(products: list[dict], prices: dict[str, float], rng: random.Random) -> list[dict]:
    goals = []
    for p in products:
        for ins in p.get("instructions", ()):
            if not ins["instruction_attributes"]:
                continue      # WebShop skips human instructions without attributes
            upper, price_text = price_upper_for(prices[p["asin"]], rng)
            goals.append(_goal(p, ins["instruction"].strip(".") + price_text, ins["instruction_attributes"],
                               list(ins.get("instruction_options") or []), upper))
    return goals


def synthetic_goals(products: list[dict], prices: dict[str, float], rng: random.Random) -> list[dict]:
    """One goal per combination of option values of each product that has a synthetic instruction."""
    goals = []
    for p in products:
        if not p.get("instruction_text"):
            continue
        upper, price_text = price_upper_for(prices[p["asin"]], rng)
        names = sorted(p["options"])
        for combo in itertools.product(*(p["options"][n] for n in names)):
            chosen = dict(zip(names, combo))
            option_text = ", and ".join(f"{k}: {v}" for k, v in chosen.items())
            option_text = f" with {option_text}" if option_text else ""
            goals.append(_goal(p, f"{p['instruction_text']}{option_text}{price_text}",
                               p["instruction_attributes"], chosen, upper))
    return goals


def build_goals(products: list[dict], prices: dict[str, float], human: bool, rng: random.Random) -> list[dict]:
    goals = human_goals(products, prices, rng) if human else synthetic_goals(products, prices, rng)
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return goals


# ------------------------------------------------------------------------------------ files
def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """`data_dir`, else `$WEBSHOP_DATA`, else None (use the generated catalog)."""
    value = data_dir if data_dir is not None else os.environ.get(DATA_ENV_VAR) or None
    return Path(value).expanduser() if value else None


def check_variant(variant: str | None) -> None:
    """Refuse a `variant` that is neither None nor a key of DATA_FILES, whichever catalog is used
    (the generated one ignores it, but a typo should not pass there and fail with real data)."""
    if variant is not None and variant not in DATA_FILES:
        raise ValueError(f"unknown WebShop data variant {variant!r}; valid: {sorted(DATA_FILES)}")


def data_files(data_dir: Path, variant: str | None = None, human_goals: bool = True) -> dict[str, Path]:
    """The file paths to read from `data_dir` (variant '1000' or 'full'; None: '1000' if present, else 'full')."""
    check_variant(variant)
    if not data_dir.is_dir():
        raise WebShopDataError(f"WebShop data folder {str(data_dir)!r} does not exist (set {DATA_ENV_VAR} or data_dir "
                               "to a folder with WebShop's files, or leave both unset for the generated catalog)")
    variants = [variant] if variant else ["1000", "full"]
    for v in variants:
        items, attrs = (data_dir / f for f in DATA_FILES[v])
        if items.exists():
            files = {"products": items, "attributes": attrs}
            if human_goals:
                files["human_instructions"] = data_dir / HUMAN_FILE
            missing = [str(f) for f in files.values() if not f.exists()]
            if missing:
                raise WebShopDataError(f"WebShop data folder {str(data_dir)!r} lacks {missing}")
            return files
    wanted = [DATA_FILES[v][0] for v in variants]
    present = sorted(p.name for p in data_dir.glob("*.json"))
    raise WebShopDataError(f"no WebShop product file {wanted} in {str(data_dir)!r} (found: {present})")


def load_data_dir(data_dir: Path, variant: str | None = None, human_goals: bool = True) -> RawData:
    files = data_files(data_dir, variant, human_goals)
    read = {k: json.loads(Path(f).read_text(encoding="utf-8")) for k, f in files.items()}
    return RawData(products=read["products"], attributes=read["attributes"],
                   human_instructions=read.get("human_instructions", {}))


def write_data_dir(raw: RawData, data_dir: str | os.PathLike, variant: str = "1000") -> dict[str, Path]:
    """Write `raw` as the real files (what `load_data_dir` reads back)."""
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    items, attrs = DATA_FILES[variant]
    paths = {"products": data_dir / items, "attributes": data_dir / attrs, "human_instructions": data_dir / HUMAN_FILE}
    for key, obj in (("products", raw.products), ("attributes", raw.attributes),
                     ("human_instructions", raw.human_instructions)):
        paths[key].write_text(json.dumps(obj, ensure_ascii=False), encoding="utf-8")
    return paths
