"""WebShop as an offline Gymnasium environment (`agentq/WebShop-v0`).

Modules: `catalog` (seeded product catalog in the real file format), `data` (real-file loader,
normalisation, goals), `search` (BM25), `pages` (page flow, actions, text), `reward`, `experts`
(the oracle expert), `shop` (all of it together, cached per process), `env` (`WebShopEnv`), `web` (the shop as
HTML on localhost). See docs/envs/webshop.md.
"""
from .env import WebShopEnv
from .shop import Shop, get_shop

__all__ = ["Shop", "WebShopEnv", "get_shop"]
