"""WebShop (Yao et al., 2022) as an agentq `TextEnv`: `gymnasium.make("agentq/WebShop-v0")`.

A task is a goal index (task id "0", "1", ...): the goal list is built and shuffled with seed 233 as
WebShop does, and split by index: `test` = 0–499, `dev` = 500–1499, `train` = 1500 onward
(`split_sizes` changes the first two), train leaving out any goal alike to a held-out one (`train_goals`). The shop is the seeded generated catalog unless `data_dir` (or
the `WEBSHOP_DATA` environment variable) names a folder with WebShop's real files.

Observations are WebShop's text ("simple") mode; actions `search[...]` and `click[...]`;
`info["admissible_actions"]` lists `click[...]` for every clickable and `search[<your query>]` where the
page has a search box (any `search[keywords]` is valid there). The episode ends at `Buy Now` with
WebShop's reward in [0, 1] (`won` when it is 1.0); `info["reward_info"]` then holds its sub-scores.
"""
from __future__ import annotations

import json
import numbers
import os
from typing import Any, ClassVar, Mapping, Sequence

from ..base import TaskStep, TextEnv
from .data import resolve_data_dir
from .experts import oracle_action
from .pages import DONE, SEP, Session, StepOutcome
from .shop import Shop, get_shop

DEFAULT_SPLIT_SIZES = {"test": 500, "dev": 1000}


def goal_signature(goal: dict) -> str:
    """What an agent is asked: the instruction, the attributes, the options and the price limit. Two
    goals alike in these are one task to the agent, which cannot tell them apart; the reward's type
    match also reads the goal's query, category and product name, so their scores may differ a little
    (left out here: for a leak, being asked the same is what counts)."""
    return json.dumps([goal["instruction_text"], sorted(goal["attributes"]), goal["price_upper"],
                       sorted(map(str, goal["goal_options"]))])


def train_goals(goals: Sequence[dict], held_out: Sequence[int], train: Sequence[int]) -> list[int]:
    """The train split's goal indices: `train` without the goals alike (`goal_signature`) to a held-out
    one, which would put a test or dev task into training under another id (the generated catalog
    has one: goal 2250, a copy of dev goal 773)."""
    seen = {goal_signature(goals[i]) for i in held_out}
    return [i for i in train if goal_signature(goals[i]) not in seen]


class WebShopEnv(TextEnv):
    splits: ClassVar[tuple[str, ...]] = ("train", "dev", "test")
    default_max_steps: ClassVar[int] = 15

    def __init__(self, data_dir: str | None = None, variant: str | None = None, num_products: int | None = None,
                 catalog_seed: int = 0, goals_per_product: int = 3, human_goals: bool = True, price_seed: int = 0,
                 noun_tagger: str = "heuristic", split_sizes: dict[str, int] | None = None,
                 invalid_feedback: bool = True, **kwargs):
        """
        data_dir: folder with WebShop's real files (items_shuffle[_1000].json, items_ins_v2[_1000].json,
            items_human_ins.json); None: `$WEBSHOP_DATA`, else the generated catalog.
        variant: real files to read, "1000" or "full" (None: "1000" when present); the generated catalog
            ignores it (an unknown one is refused either way).
        num_products: generated catalog size (None: 1000); with real data, keep the first N products
            of the file, as WebShop's `num_products` does (None: all).
        catalog_seed, goals_per_product: the generated catalog's seed and human-style goals per product.
        human_goals: goals from the human instructions (True) or synthetic ones, one per option combination.
        price_seed: seed of the selling prices of price ranges and of the goals' price limits.
        noun_tagger: "heuristic" (default, see reward.py) or "spacy" (needs spaCy + en_core_web_sm).
        split_sizes: {"test": n, "dev": m}: test = goals [0, n), dev = [n, n+m), train = the rest.
        invalid_feedback: prefix the observation of an invalid action with the reason (False: the page
            text alone, byte-identical to WebShop).
        """
        super().__init__(**kwargs)
        sizes = dict(DEFAULT_SPLIT_SIZES)
        unknown = set(split_sizes or {}) - set(sizes)
        if unknown:
            raise ValueError(f"unknown split_sizes key(s) {sorted(unknown)}; valid: {sorted(sizes)} (train is the rest)")
        sizes.update(split_sizes or {})
        # a negative size would make negative goal ids, which index the goal list from its end: train goals
        bad = {k: v for k, v in sizes.items() if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0}
        if bad:
            raise ValueError(f"split_sizes must be non-negative ints, got {bad} (valid: e.g. {DEFAULT_SPLIT_SIZES})")
        self.shop: Shop = get_shop(data_dir=data_dir, variant=variant, num_products=num_products,
                                   catalog_seed=catalog_seed, goals_per_product=goals_per_product,
                                   human_goals=human_goals, price_seed=price_seed, noun_tagger=noun_tagger)
        n_test, n_dev, total = int(sizes["test"]), int(sizes["dev"]), len(self.shop.goals)
        if total <= n_test + n_dev:
            # goals_per_product acts on the generated catalog alone; real data has the goals of its files
            hint = ("raise num_products / goals_per_product" if self.shop.source.startswith("generated") else
                    "use more of the real data (num_products: null keeps every product; variant: full)")
            raise ValueError(
                f"the shop ({self.shop.source}) has {total} goals, but test + dev take {n_test + n_dev} and train "
                f"needs the rest; {hint} or lower split_sizes")
        held_out = range(0, n_test + n_dev)
        self._ranges = {"test": range(0, n_test), "dev": range(n_test, n_test + n_dev),
                        "train": train_goals(self.shop.goals, held_out, range(n_test + n_dev, total))}
        self.invalid_feedback = bool(invalid_feedback)
        self.session: Session | None = None

    @classmethod
    def resolved_kwargs(cls, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """data_dir as an absolute folder, `$WEBSHOP_DATA`'s behind a None (a real-catalog run and a
        generated-catalog one then differ in their settings); {} for the generated catalog."""
        given = kwargs.get("data_dir")
        if given is not None and not isinstance(given, (str, os.PathLike)):
            return {}                   # the constructor refuses it, saying why
        found = resolve_data_dir(given)
        return {"data_dir": str(found.absolute())} if found is not None else {}

    # ------------------------------------------------------------------ TextEnv hooks
    def _tasks(self, split: str) -> list[str]:
        return [str(i) for i in self._ranges[split]]

    def _reset_task(self, task_id: str, split: str) -> tuple[str, TaskStep]:
        goal = self.shop.goals[int(task_id)]
        self.session = Session(self.shop, goal)
        return goal["instruction_text"], self._to_step()

    def _step_task(self, action: str) -> TaskStep:
        out = self._live_session().step(action)
        obs = self._live_session().text()
        if not out.valid and self.invalid_feedback:
            obs = f"Invalid action: {out.feedback}.{SEP}{obs}"
        return self._to_step(obs, out)

    def _expert_action(self) -> str | None:
        return oracle_action(self._live_session())

    # ------------------------------------------------------------------ helpers
    def _live_session(self) -> Session:
        assert self.session is not None, "no episode: reset() first"   # TextEnv.step checks this before
        return self.session

    def _to_step(self, obs: str | None = None, out: StepOutcome | None = None) -> TaskStep:
        s = self._live_session()
        done = s.page == DONE
        extra = {"page": s.page, "available_actions": s.available_actions(),
                 "action_valid": True if out is None else out.valid}
        if out is not None and not out.valid:
            extra["feedback"] = out.feedback
        reward = float(out.reward) if out is not None else 0.0
        if done:
            extra.update(reward_info=dict(s.reward_info or {}), purchased_asin=s.asin,
                         purchased_options=dict(s.options),
                         goal_asin=s.goal["asin"])
        return TaskStep(obs=s.text() if obs is None else obs, reward=reward, done=done,
                        won=done and (s.reward or 0.0) >= 1.0 - 1e-9, score=float(s.reward or 0.0) if done else 0.0,
                        admissible_actions=[] if done else s.admissible_actions(), extra=extra)

    @property
    def goal(self) -> dict | None:
        return self.session.goal if self.session else None
