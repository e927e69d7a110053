"""A `Shop`: products, prices, goals, search and reward together; built once per process and shared.

    shop = get_shop()                              # generated catalog (seeded)
    shop = get_shop(data_dir="~/webshop/data")     # the real files (or set WEBSHOP_DATA)
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path

from .catalog import generate_catalog
from .data import RawData, build_goals, check_variant, load_data_dir, normalize_products, product_prices, resolve_data_dir
from .reward import compute_reward, noun_tagger
from .search import ProductSearch


@dataclass
class Shop:
    products: list[dict]
    by_asin: dict[str, dict]
    prices: dict[str, float]
    goals: list[dict]
    search_engine: ProductSearch
    noun_tagger: str = "heuristic"
    source: str = "generated"

    def search(self, keywords: str) -> list[str]:
        return self.search_engine.search(keywords)

    def reward(self, goal: dict, asin: str, options: dict[str, str]) -> tuple[float, dict]:
        return compute_reward(self.by_asin[asin], goal, self.prices[asin], options, noun_tagger(self.noun_tagger))


def build_shop(raw: RawData, human_goals: bool = True, num_products: int | None = None, price_seed: int = 0,
               noun_tagger_name: str = "heuristic", source: str = "generated") -> Shop:
    noun_tagger(noun_tagger_name)      # validate early
    products = normalize_products(raw, human_goals=human_goals, num_products=num_products)
    rng = random.Random(price_seed)
    prices = product_prices(products, rng)
    goals = build_goals(products, prices, human_goals, rng)
    return Shop(products=products, by_asin={p["asin"]: p for p in products}, prices=prices, goals=goals,
                search_engine=ProductSearch(products), noun_tagger=noun_tagger_name, source=source)


@functools.lru_cache(maxsize=8)
def _cached_shop(data_dir: str | None, variant: str | None, num_products: int | None, catalog_seed: int,
                 goals_per_product: int, human_goals: bool, price_seed: int, noun_tagger_name: str) -> Shop:
    if data_dir is None:
        raw = generate_catalog(num_products=1000 if num_products is None else num_products, seed=catalog_seed,
                               goals_per_product=goals_per_product)
        return build_shop(raw, human_goals, None, price_seed, noun_tagger_name, source=f"generated(seed={catalog_seed})")
    raw = load_data_dir(Path(data_dir), variant=variant, human_goals=human_goals)
    return build_shop(raw, human_goals, num_products, price_seed, noun_tagger_name, source=str(data_dir))


def get_shop(data_dir: str | None = None, variant: str | None = None, num_products: int | None = None,
             catalog_seed: int = 0, goals_per_product: int = 3, human_goals: bool = True, price_seed: int = 0,
             noun_tagger: str = "heuristic") -> Shop:
    """The shop for these settings (cached per process: environments with equal settings share it).

    data_dir: a folder with WebShop's real files; None reads `$WEBSHOP_DATA`, and when that is unset
    too the seeded catalog is generated (`num_products` (None: 1000), `catalog_seed`, `goals_per_product`).
    With real data, `num_products` keeps the first N products of the file (None: all). `variant` ("1000",
    "full", None) picks the real files; the generated catalog ignores it, but an unknown one is refused either way.
    """
    check_variant(variant)
    resolved = resolve_data_dir(data_dir)
    if resolved is None and num_products is None:
        num_products = 1000
    return _cached_shop(str(resolved) if resolved else None, variant if resolved else None, num_products,
                        int(catalog_seed), int(goals_per_product), bool(human_goals), int(price_seed), noun_tagger)
