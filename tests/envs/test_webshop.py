"""agentq/WebShop-v0: reward terms on hand-made cases, pages and actions, the real-file loader on a
fixture in WebShop's format, the generated catalog, splits, the oracle, Gymnasium's checker, and the
web view in headless Chromium (skipped when Chromium is not installed)."""
from __future__ import annotations

import itertools
import re
import threading
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from gymnasium.utils.env_checker import check_env

import agentq.envs  # noqa: F401  (registers the environments)
from agentq.agent import PromptConfig
from agentq.envs.webshop import catalog as cat
from agentq.envs.webshop.data import (load_data_dir, normalize_products, parse_pricing,
                                      price_upper_for, write_data_dir)
from agentq.envs.webshop.env import WebShopEnv
from agentq.envs.webshop.experts import oracle_action, search_queries
from agentq.envs.webshop.pages import Session
from agentq.envs.webshop.reward import (compute_reward, fuzzy_match, heuristic_nouns, normalize_color,
                                        type_reward)
from agentq.envs.webshop.shop import build_shop, get_shop
from conftest import NO_CHROMIUM, chromium, headless_chromium

FIXTURE = Path(__file__).parent / "fixtures" / "webshop"
CONF = Path(__file__).resolve().parents[2] / "conf" / "env" / "webshop.yaml"
TRAIL_CATEGORY = "Grocery & Gourmet Food › Snacks & Sweets › Snack Foods › Trail Mix"


# ------------------------------------------------------------------------------------ search
@pytest.mark.parametrize("preset", [None, "cuda"])
def test_search_keeps_jax_on_the_cpu_unless_told(preset):
    """bm25s runs a JAX op on import when JAX is installed; on a GPU machine JAX's CUDA backend would
    take 75 % of the GPU before the engine allocates. Importing the search module in a fresh process
    sets JAX_PLATFORMS=cpu, and leaves a value the user set alone (JAX itself is not needed here)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if preset is not None:
        env["JAX_PLATFORMS"] = preset
    code = "import os, agentq.envs.webshop.search; print(os.environ.get('JAX_PLATFORMS'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (preset or "cpu")


# ------------------------------------------------------------------------------------ reward
def _product(name="Acme Gluten Free Trail Mix Snack Packs", query="trail mix", category=TRAIL_CATEGORY):
    return {"asin": "B0TEST0001", "name": name, "Title": name, "query": query, "product_category": category,
            "Attributes": ["gluten free", "non gmo"], "BulletPoints": ["Keto friendly snack for hiking"],
            "Description": "Roasted almonds and cashews."}


def _goal(**kw):
    goal = {"query": "trail mix", "product_category": TRAIL_CATEGORY, "name": "Acme Gluten Free Trail Mix Snack Packs",
            "attributes": ["gluten free", "keto friendly", "low sugar"], "goal_options": ["sea salt", "6 count"],
            "price_upper": 20.0}
    goal.update(kw)
    return goal


def test_reward_all_terms_hand_computed():
    # attributes: "gluten free" (product attribute), "keto friendly" (bullet text), not "low sugar" -> 2 of 3
    # options: "sea salt" chosen; "12 count" vs "6 count" scores 83 (< 86) -> 1 of 2; price 12.99 <= 20 -> 1
    # r = 1.0 * (2 + 1 + 1) / (3 + 2 + 1) = 4/6
    r, info = compute_reward(_product(), _goal(), 12.99, {"flavor name": "sea salt", "size": "12 count"})
    assert r == pytest.approx(4 / 6)
    assert info["r_type"] == 1.0 and info["query_match"] and info["category_match"] and info["title_score"] == 1.0
    assert info["r_att"] == pytest.approx(2 / 3) and info["w_att"] == pytest.approx(3 / 6)
    assert info["r_option"] == pytest.approx(1 / 2) and info["w_option"] == pytest.approx(2 / 6)
    assert info["r_price"] is True and info["w_price"] == pytest.approx(1 / 6)
    # everything right: 1.0 exactly
    r, _ = compute_reward(_product(), _goal(attributes=["gluten free", "keto friendly"]), 12.99,
                          {"flavor name": "sea salt", "size": "6 count"})
    assert r == 1.0


def test_reward_price_term():
    r, info = compute_reward(_product(), _goal(), 25.0, {"flavor name": "sea salt", "size": "6 count"})
    assert info["r_price"] is False
    assert r == pytest.approx((2 + 2 + 0) / 6)
    assert price_upper_for(1200.0, __import__("random").Random(0)) == (1_000_000, "")   # no limit, no text


def test_reward_attribute_fuzzy_and_text_matches():
    # fuzzy: "gluten-free" vs attribute "gluten free" scores 100; text: "almonds" occurs in the description
    # "hiking snack" is neither an attribute (best score 62) nor a substring -> 2 of 3 (+ price) over 4
    r, info = compute_reward(_product(), _goal(attributes=["gluten-free", "almonds", "hiking snack"], goal_options=[]),
                             12.99, {})
    assert info["attributes_matched"] == 2 and "r_option" not in info
    assert r == pytest.approx((2 + 0 + 1) / (3 + 0 + 1))


def test_reward_colour_normalisation():
    # "navy blue" vs "royal blue" score 61 as raw strings, but both normalise to "blue" and match
    assert not fuzzy_match("royal blue", "navy blue")
    assert normalize_color("navy blue") == normalize_color("royal blue") == "blue"
    assert normalize_color("dark wash") == "ash"            # first colour word in alphabetical order wins
    assert normalize_color("sea salt") == "sea salt"
    r, info = compute_reward(_product(), _goal(attributes=["gluten free"], goal_options=["navy blue"]), 12.99,
                             {"color": "royal blue"})
    assert info["options_matched"] == 1 and r == 1.0


def test_reward_synthetic_goal_options_are_name_value_pairs():
    # synthetic goals keep options as a dict; WebShop scores them as (name, value) pairs
    goal = _goal(attributes=["gluten free"], goal_options={"flavor name": "sea salt", "size": "6 count"})
    r, info = compute_reward(_product(), goal, 12.99, {"flavor name": "sea salt", "size": "6 count"})
    assert info["options_matched"] == 2 and r == 1.0
    r, info = compute_reward(_product(), goal, 12.99, {"flavor name": "dark chocolate", "size": "6 count"})
    assert info["options_matched"] == 1 and r == pytest.approx(3 / 4)


def test_type_reward_rules():
    goal = _goal()   # goal nouns (heuristic): acme gluten free trail mix snack packs -> 7
    assert heuristic_nouns(goal["name"]) == ["acme", "gluten", "free", "trail", "mix", "snack", "packs"]
    other_cat = "Home & Kitchen › Kitchen & Dining › Small Appliances › Blenders"
    # 1 of 7 nouns shared (0.143), other query, other category -> 0.5
    t = type_reward(_product("Mix Master Blender", "blender", other_cat), goal)
    assert t["title_score"] == pytest.approx(1 / 7) and t["r_type"] == 0.5
    # same overlap but two category levels shared -> 1.0
    t = type_reward(_product("Mix Master Blender", "blender", "Grocery & Gourmet Food › Snacks & Sweets › Candy"), goal)
    assert t["category_match"] and t["r_type"] == 1.0
    # 2 of 7 shared (0.286 > 0.2) -> 1.0 without query or category match
    assert type_reward(_product("Acme Snack Bowl", "bowl", other_cat), goal)["r_type"] == 1.0
    # overlap below 0.1 -> 0.1 (1 of 13 nouns), even when the query matches
    long_goal = _goal(name="Acme Gluten Free Trail Mix Snack Packs for Hiking Camping Travel Office School Kids")
    t = type_reward(_product("Camping Lantern", "trail mix", other_cat), long_goal)
    assert t["title_score"] == pytest.approx(1 / 13) and t["r_type"] == 0.1
    # no shared noun -> 0.0 even with the same query, and the whole reward is 0
    r, info = compute_reward(_product("Zenith Widget", "trail mix"), goal, 12.99, {"flavor name": "sea salt"})
    assert info["r_type"] == 0.0 and r == 0.0
    # a goal name without nouns counts as overlap 0.2 (-> 0.5 without query/category match)
    assert type_reward(_product("Acme", "x", other_cat), _goal(name="For The"))["r_type"] == 0.5


# ------------------------------------------------------------------------------------ loader
def test_loader_reads_fixture_in_real_format():
    raw = load_data_dir(FIXTURE)
    products = normalize_products(raw)
    # duplicate asin, "nan" and an 11-character asin are dropped, as in WebShop
    assert [p["asin"] for p in products] == ["B01FIXT001", "B01FIXT002", "B01FIXT003", "B01FIXT005", "B01FIXT006"]
    by = {p["asin"]: p for p in products}
    assert by["B01FIXT001"]["query"] == "trail mix"                              # lower-cased, stripped
    assert by["B01FIXT001"]["options"] == {"flavor name": ["sea salt", "dark chocolate"],
                                           "size": ["6 count", "12 count | pack"]}  # "/" -> " | "
    assert by["B01FIXT001"]["option_to_image"]["dark chocolate"] == "https://example.invalid/dark.jpg"
    assert by["B01FIXT002"]["pricing"] == [8.5, 15.0] and by["B01FIXT002"]["Price"] == "$8.5 to $15.0"
    assert by["B01FIXT005"]["pricing"] == [100.0] and by["B01FIXT005"]["Price"] == "$100.0"   # empty pricing
    assert by["B01FIXT005"]["BulletPoints"] == ["Moisturizing formula with shea butter"]       # str -> [str]
    assert by["B01FIXT005"]["Attributes"] == [] and by["B01FIXT006"]["Attributes"] == ["DUMMY_ATTR"]
    assert by["B01FIXT006"]["options"] == {"color": ["walnut", "white"]}                     # null group skipped
    assert parse_pricing("$1,299.00") == ([1299.0], "$1299.0")


def test_loader_goals_human_and_synthetic():
    shop = get_shop(data_dir=str(FIXTURE))
    # human: 6 instructions for loaded products, one without attributes is skipped -> 5
    assert len(shop.goals) == 5
    assert sorted(g["asin"] for g in shop.goals) == ["B01FIXT001", "B01FIXT002", "B01FIXT003", "B01FIXT003",
                                                     "B01FIXT006"]
    g = next(g for g in shop.goals if g["asin"] == "B01FIXT001")
    assert g["instruction_text"] == ("i need gluten free trail mix in sea salt flavor, 6 count, "
                                     f"and price lower than {g['price_upper']:.2f} dollars")
    assert g["goal_options"] == ["sea salt", "6 count"] and g["attributes"] == ["gluten free"]
    for g in shop.goals:
        price = shop.prices[g["asin"]]
        assert price < g["price_upper"] <= price + 40 and g["price_upper"] % 10 == 0
    lo, hi = shop.by_asin["B01FIXT002"]["pricing"]
    assert lo <= shop.prices["B01FIXT002"] <= hi
    # synthetic: one goal per option combination of each product with an instruction: 2x2 + 2x3
    syn = get_shop(data_dir=str(FIXTURE), human_goals=False)
    assert len(syn.goals) == 10
    texts = {g["instruction_text"].rsplit(", and price", 1)[0] for g in syn.goals}
    assert "Find me gluten free, non gmo trail mix with flavor name: sea salt, and size: 12 count | pack" in texts


def test_env_on_real_files_via_environment_variable(monkeypatch):
    monkeypatch.setenv("WEBSHOP_DATA", str(FIXTURE))
    env = WebShopEnv(split="test", expert=True, split_sizes={"test": 2, "dev": 1})
    assert env.shop.source == str(FIXTURE)
    assert env.list_tasks("test") == ["0", "1"] and env.list_tasks("dev") == ["2"] and env.list_tasks("train") == ["3", "4"]
    for split in env.splits:
        for tid in env.list_tasks(split):
            obs, info = env.reset(options={"task_id": tid, "split": split})
            while True:
                obs, r, term, trunc, info = env.step(info["expert_action"])
                if term or trunc:
                    break
            assert term and info["won"] and r == 1.0


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="items_shuffle_1000.json"):
        get_shop(data_dir=str(tmp_path))
    with pytest.raises(ValueError, match="valid: \\['1000', 'full'\\]"):
        get_shop(data_dir=str(FIXTURE), variant="10k")
    with pytest.raises(ValueError, match="has 5 goals"):
        WebShopEnv(data_dir=str(FIXTURE))
    with pytest.raises(ValueError, match="valid: \\['heuristic', 'spacy'\\]"):
        get_shop(noun_tagger="pos")


# ------------------------------------------------------------------------------------ catalog
def test_catalog_vocabularies_do_not_match_themselves():
    """Within a type no two attributes, and within an option group no two values, match under the
    reward's fuzzy rule; otherwise picking the wrong one would still score."""
    for t in cat.TYPES:
        for a, b in itertools.combinations(t.attributes, 2):
            assert not fuzzy_match(a, b), (t.query, a, b)
        for name, values in t.options:
            for a, b in itertools.combinations([v.lower() for v in values], 2):
                assert not fuzzy_match(normalize_color(a), normalize_color(b)), (t.query, name, a, b)


def test_generated_goals_of_a_product_are_distinct():
    """Each product's human-style goals are distinct (two equal draws put one task in train and in
    dev); a repeat is redrawn from its own generator, so the other goals stay as they were."""
    raw = cat.generate_catalog(num_products=1000, seed=0, goals_per_product=3)
    repeats = {asin: goals for asin, goals in raw.human_instructions.items()
               if len({(g["instruction"], tuple(g["attributes"]), tuple(g["options"])) for g in goals}) < len(goals)}
    assert repeats == {}
    goals = get_shop().goals                             # task ids keep their goals (5 repeats, in dev/train, changed)
    assert goals[0]["instruction_text"] == ("find me open toe, memory foam and non slip women's sandals, brown color "
                                            "and size 8, and price lower than 90.00 dollars")
    assert goals[1500]["instruction_text"].startswith("i am looking for natural ingredients, clinically proven and "
                                                      "fresh breath toothpaste with flavor name: strawberry")


def test_catalog_is_deterministic_and_in_real_format(tmp_path):
    a, b = cat.generate_catalog(120, seed=3, goals_per_product=2), cat.generate_catalog(120, seed=3, goals_per_product=2)
    assert a == b
    assert cat.generate_catalog(120, seed=4).products != a.products
    rec = a.products[0]
    assert {"asin", "name", "full_description", "small_description", "pricing", "customization_options", "images",
            "category", "query", "product_category"} <= set(rec)
    assert rec["pricing"].startswith("$") and " › " in rec["product_category"] and len(rec["asin"]) == 10
    # written as the real files and read back, it gives the same shop
    write_data_dir(a, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["items_human_ins.json", "items_ins_v2_1000.json",
                                                          "items_shuffle_1000.json"]
    back = build_shop(load_data_dir(tmp_path))
    direct = build_shop(a)
    assert back.goals == direct.goals and back.products == direct.products


def test_distractors_share_type_and_attributes():
    shop = get_shop()
    goal = shop.goals[0]
    same_type = [p for p in shop.products if p["query"] == goal["query"] and p["asin"] != goal["asin"]]
    assert len(same_type) >= 20
    sharing = [p for p in same_type if set(goal["attributes"]) & set(p["Attributes"])]
    assert len(sharing) >= 5
    lacking = [p for p in same_type if not set(goal["attributes"]) <= set(p["Attributes"])]
    assert len(lacking) >= 10


# ------------------------------------------------------------------------------------ env
@pytest.fixture(scope="module")
def env():
    cfg = yaml.safe_load(CONF.read_text())
    e = gym.make("agentq/WebShop-v0", split=cfg["eval_split"], max_steps=cfg["max_steps"], expert=True, **cfg["kwargs"])
    yield e
    e.close()


def test_config_and_splits(env):
    cfg = yaml.safe_load(CONF.read_text())
    assert set(cfg) == set(yaml.safe_load((CONF.parent / "textworld_express.yaml").read_text()))
    assert cfg["name"] == "webshop" and cfg["max_steps"] == 15 and cfg["eval_split"] == "test"
    e = env.unwrapped
    assert len(e.shop.goals) == 3000
    test, dev, train = (e.list_tasks(s) for s in ("test", "dev", "train"))
    assert (test[0], test[-1], len(test)) == ("0", "499", 500)
    assert (dev[0], dev[-1], len(dev)) == ("500", "1499", 1000)
    assert (train[0], len(train)) == ("1500", 1499) and "2250" not in train     # goal 2250 copies dev goal 773
    _, info = env.reset(options={"task_id": "0"})
    PromptConfig(**cfg["prompt"]).check_fields(info)         # the agent loop's check at reset


def test_check_env_passes(env):
    check_env(env.unwrapped)


def test_pages_text_and_actions():
    env = e = WebShopEnv(split="test", max_steps=50)       # same shop as the configured env (cached)
    obs, info = env.reset(options={"task_id": "0", "split": "test"})
    goal = e.goal
    inst = goal["instruction_text"]
    assert obs == f"WebShop [SEP] Instruction: [SEP] {inst} [SEP] Search"
    assert info["admissible_actions"] == ["search[<your query>]"]
    assert info["available_actions"] == {"has_search_bar": True, "clickables": ["search"]}
    assert info["task"] == inst and info["task_id"] == "0" and info["split"] == "test"

    obs, r, term, trunc, info = env.step(f"search[{search_queries(goal)[0]}]")
    assert r == 0 and not term
    products = e.session.page_products()
    assert len(products) == 10 and len(e.session.results) == 50
    first = e.shop.by_asin[products[0]]
    assert obs.startswith(f"Instruction: [SEP] {inst} [SEP] Back to Search [SEP] Page 1 (Total results: 50) "
                          f"[SEP] Next > [SEP] {products[0]} [SEP] {first['Title']} [SEP] {first['Price']} [SEP] ")
    assert info["admissible_actions"][:2] == ["click[back to search]", "click[next >]"]
    assert info["admissible_actions"][2:] == [f"click[{a.lower()}]" for a in products]

    # pages 2..5, then an empty page 6 (WebShop keeps "Next >" on every results page)
    for page in range(2, 7):
        obs, *_ = env.step("click[next >]")
        assert f"Page {page} (Total results: 50) [SEP] < Prev [SEP] Next >" in obs
    assert obs.endswith("< Prev [SEP] Next >")
    for _ in range(5):
        obs, *_ = env.step("click[< prev]")
    assert "Page 1 (Total results: 50) [SEP] Next >" in obs and "< Prev" not in obs

    # item page, options, sub-pages
    target = e.shop.by_asin[products[0]]
    obs, *_, info = env.step(f"click[{products[0].lower()}]")
    opt_text = " [SEP] ".join(f"{n} [SEP] " + " [SEP] ".join(v) for n, v in target["options"].items())
    assert obs == (f"Instruction: [SEP] {inst} [SEP] Back to Search [SEP] < Prev [SEP] {opt_text} [SEP] "
                   f"{target['Title']} [SEP] Price: {target['Price']} [SEP] Rating: N.A. [SEP] Description "
                   f"[SEP] Features [SEP] Reviews [SEP] Buy Now")
    values = [v for vs in target["options"].values() for v in vs]
    assert info["available_actions"]["clickables"] == ["back to search", "< prev", "description", "features",
                                                       "reviews", "buy now", *values]
    name, vals = next(iter(target["options"].items()))
    env.step(f"click[{vals[-1]}]")
    assert e.session.options == {name: vals[-1]}
    obs, *_ = env.step("click[Features]")          # arguments are lower-cased
    assert obs == f"Instruction: [SEP] {inst} [SEP] Back to Search [SEP] < Prev [SEP] " + " [SEP] ".join(
        target["BulletPoints"])
    obs, *_ = env.step("click[description]")
    assert obs.startswith("Invalid action")          # not clickable on a sub-page
    env.step("click[< prev]")
    obs, *_ = env.step("click[reviews]")
    assert obs == f"Instruction: [SEP] {inst} [SEP] Back to Search [SEP] < Prev"   # WebShop shows no reviews
    env.step("click[< prev]")
    assert e.session.page == "item" and e.session.options == {name: vals[-1]}
    env.step("click[< prev]")                          # back to the same results page; options reset
    assert e.session.page == "results" and e.session.options == {} and e.session.page_num == 1
    obs, *_, info = env.step("click[back to search]")
    assert obs == f"WebShop [SEP] Instruction: [SEP] {inst} [SEP] Search" and info["steps"] == 20


def test_invalid_actions_are_no_ops(env):
    e = env.unwrapped
    obs0, _ = env.reset(options={"task_id": "1", "split": "test"})
    for bad in ["click[search]", "click[buy now]", "Search[shoes]", "buy now", "search[]", ""]:
        obs, r, term, trunc, info = env.step(bad)
        assert not info["action_valid"] and r == 0 and not term and e.session.page == "search"
        assert obs.startswith("Invalid action: ") and obs.endswith(obs0)
    env.step("search[shoes]")
    obs, r, term, trunc, info = env.step("search[hats]")       # no search box on the results page
    assert not info["action_valid"] and "no search box" in info["feedback"] and e.session.keywords == ["shoes"]
    # without feedback, the observation is the unchanged page, as in WebShop
    quiet = WebShopEnv(split="test", invalid_feedback=False)
    obs0, _ = quiet.reset(options={"task_id": "1"})
    assert quiet.step("click[nothing]")[0] == obs0


def test_a_search_with_a_one_letter_word_is_a_search(env):
    """PyStemmer's Porter stems "s" to "", which bm25s indexes without a row of scores: `search[men s
    shoes]` (a possessive a model split) raised ValueError out of `step`. One- and two-letter words
    stay unstemmed, as Porter's rule has it; longer words are stemmed as before."""
    from agentq.envs.webshop.search import analyze

    assert analyze("Men s shoes, US size") == ["men", "s", "shoe", "us", "size"]
    assert analyze("the abilities") == ["abil"]
    env.reset(options={"task_id": "3", "split": "test"})
    obs, r, term, trunc, info = env.step("search[men s shoes]")
    assert info["action_valid"] and env.unwrapped.session.page == "results" and not term, obs
    # the lone letter is one more term, not an empty page
    shop = env.unwrapped.shop
    assert env.unwrapped.session.results == shop.search("men s shoes") != []


def test_step_cap_truncates(env):
    env.reset(options={"task_id": "2", "split": "test"})
    for i in range(15):
        obs, r, term, trunc, info = env.step("click[nothing]")
    assert trunc and not term and not info["won"] and info["expert_action"] is None
    with pytest.raises(RuntimeError):
        env.step("click[nothing]")


def _run_oracle(env, task_id):
    obs, info = env.reset(options={"task_id": task_id, "split": "test"})
    while True:
        obs, r, term, trunc, info = env.step(info["expert_action"])
        if term or trunc:
            return r, info


def test_oracle_scores_one_on_first_100_test_goals(env):
    rewards, steps = [], []
    for tid in env.unwrapped.list_tasks("test")[:100]:
        r, info = _run_oracle(env, tid)
        rewards.append(r)
        steps.append(info["steps"])
        assert info["won"] and info["score"] == 1.0 and info["purchased_asin"] == info["goal_asin"]
    assert sum(rewards) / len(rewards) == 1.0
    assert max(steps) <= 15 and 4 <= sum(steps) / len(steps) <= 7


def test_first_result_without_options_scores_well_below(env):
    e = env.unwrapped
    rewards, caps = [], []
    for tid in e.list_tasks("test")[:100]:
        env.reset(options={"task_id": tid, "split": "test"})
        goal = e.goal
        env.step(f"search[{search_queries(goal)[0]}]")
        env.step(f"click[{e.session.page_products()[0].lower()}]")
        obs, r, term, trunc, info = env.step("click[buy now]")
        ri = info["reward_info"]
        assert term and set(ri) >= {"r_type", "r_att", "w_att", "query_match", "category_match", "title_score"}
        # by hand from the goal: no option was clicked, so none matches, and the reward is
        # (attributes matched + price ok) / (n_att + n_opt + 1) · r_type ≤ (n_att + 1) / (n_att + n_opt + 1)
        n_att, n_opt = len(goal["attributes"]), len(goal["goal_options"])
        assert ri["options_matched"] == 0 and 0 <= ri["attributes_matched"] <= n_att
        price_ok = ri.get("r_price", False)
        assert r == pytest.approx((ri["attributes_matched"] + price_ok) / (n_att + n_opt + 1) * ri["r_type"])
        caps.append((n_att + 1) / (n_att + n_opt + 1))
        assert r <= caps[-1] + 1e-12
        rewards.append(r)
    mean = sum(rewards) / len(rewards)
    assert mean <= sum(caps) / len(caps) < 1.0             # every goal here asks for an option
    assert mean == pytest.approx(0.5685, abs=0.03)       # regression pin, measured: 0.5685 (oracle: 1.0)
    assert sum(r == 1.0 for r in rewards) == 0             # never a win without the goal's options


def test_oracle_recovers_from_a_wrong_item(env):
    e = env.unwrapped
    obs, info = env.reset(options={"task_id": "5", "split": "test"})
    env.step(f"search[{e.goal['query']}]")
    wrong = next(a for a in e.session.page_products() if a != e.goal["asin"])
    obs, r, term, trunc, info = env.step(f"click[{wrong.lower()}]")
    assert info["expert_action"] == "click[< prev]"
    while not (term or trunc):
        obs, r, term, trunc, info = env.step(info["expert_action"])
    assert info["won"]


def test_reset_is_seeded_and_ids_are_checked(env):
    a = env.reset(seed=7)[1]["task_id"]
    assert env.reset(seed=7)[1]["task_id"] == a and a in env.unwrapped.list_tasks("test")
    with pytest.raises(KeyError, match="unknown task_id"):
        env.reset(options={"task_id": "0", "split": "train"})
    with pytest.raises(ValueError, match="valid: \\['dev', 'test'\\]"):
        WebShopEnv(split_sizes={"val": 3})


def test_split_sizes_must_be_non_negative_ints():
    # a negative size made negative goal ids, and goals[-1] is a train goal: dev and train overlapped
    with pytest.raises(ValueError, match="split_sizes must be non-negative ints, got \\{'test': -5\\}"):
        WebShopEnv(split_sizes={"test": -5, "dev": 1000})
    with pytest.raises(ValueError, match="got \\{'dev': 2.5\\}"):
        WebShopEnv(split_sizes={"dev": 2.5})


# ----------------------------------------------------------- the TextEnv base class, on this JVM-free env
def test_an_episode_split_does_not_stick(env):
    """reset(options={"split": ...}) picks one episode's split; plain resets keep sampling the split
    the env was made with (before: one held-out episode turned every later training reset into a
    held-out one)."""
    e = WebShopEnv(split="train")                        # the same (cached) shop as `env`
    assert e.reset(options={"split": "test", "task_id": "3"})[1]["split"] == "test"
    assert e.split == "train" and e.list_tasks() == e.list_tasks("train")
    infos = [e.reset(seed=s)[1] for s in range(5)]
    assert {i["split"] for i in infos} == {"train"} and all(i["task_id"] in e.list_tasks("train") for i in infos)


def test_reset_seeds_take_numpy_ints_and_refuse_negatives(env):
    import numpy as np

    a = env.reset(seed=7)[1]["task_id"]
    assert env.reset(seed=np.int64(7))[1]["task_id"] == a           # (Gymnasium's seeding wants an int)
    with pytest.raises(ValueError, match="must be >= 0 or None, got -1"):
        env.reset(seed=-1)
    with pytest.raises(TypeError, match="must be an int or None, got float"):
        env.reset(seed=1.0)


def test_sampled_actions_are_valid_actions(env):
    """action_space.sample() draws only characters the env accepts (string.printable's vertical tab
    and form feed are control characters, refused as an invalid turn)."""
    from agentq.envs import action_problem

    space = env.unwrapped.action_space
    space.seed(0)
    samples = [space.sample() for _ in range(100)]
    assert [s for s in samples if action_problem(s, space.max_length)] == []
    env.reset(seed=0)
    assert "invalid_action" not in env.step(samples[0])[4]


# ------------------------------------------------------------------------------------ web view
@pytest.mark.skipif(chromium() is None, reason=NO_CHROMIUM)
def test_web_view_in_headless_chromium(tmp_path):
    pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install selenium)")
    from selenium.common.exceptions import JavascriptException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from agentq.envs.webshop.web import check_loopback, make_server

    def bar_text(d) -> str:
        return d.execute_script("const b = document.querySelector('.bar'); return b ? b.textContent : '';")

    with pytest.raises(ValueError, match="loopback only"):
        check_loopback("0.0.0.0")
    server = make_server("127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    driver = headless_chromium(tmp_path / "chromium-profile")
    try:
        shop = server.app.config["webshop_env"].shop
        session = Session(shop, shop.goals[0])          # goal test/0, followed in the browser by the oracle
        driver.get(f"{base}/goal/test/0")
        assert driver.find_element(By.ID, "instruction").text == shop.goals[0]["instruction_text"]
        step = 0
        while (action := oracle_action(session)) is not None:
            if action == "click[buy now]":
                driver.save_screenshot(str(tmp_path / "webshop_item_page.png"))
            if action.startswith("search["):
                box = driver.find_element(By.ID, "search_input")
                box.send_keys(action[len("search["):-1])
                box.submit()
            else:
                driver.find_element(By.CSS_SELECTOR, f'button[value="{action}"]').click()
            session.step(action)
            step += 1
            # Read the bar in one script call: an element handle found while the click's navigation is
            # still under way can belong to the old document (chromedriver then raises a plain
            # WebDriverException, "Node ... does not belong to the document", seen once in CI).
            WebDriverWait(driver, 10, ignored_exceptions=(JavascriptException, StaleElementReferenceException)).until(
                lambda d, n=step: f"step {n} " in bar_text(d))
        assert driver.find_element(By.ID, "reward").text == "1.0"
        shot = tmp_path / "webshop_done_page.png"
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 5_000
        # the oracle's episode, replayed step by step
        driver.get(f"{base}/expert/test/0")
        assert "(start)" in driver.page_source and "search[" in driver.page_source
        for k in range(1, step + 1):
            driver.find_element(By.ID, "next-step").click()
            WebDriverWait(driver, 10, ignored_exceptions=(JavascriptException, StaleElementReferenceException)).until(
                lambda d, k=k: f"after {k} of {step} actions" in bar_text(d))
        assert f"after {step} of {step} actions · reward 1.0" in bar_text(driver)
        driver.save_screenshot(str(tmp_path / "webshop_replay.png"))
        print(f"\nweb view screenshots: {tmp_path}")
    finally:
        driver.quit()
        server.shutdown()


def test_missing_data_is_one_line_in_agentq_eval(tmp_path, monkeypatch):
    """WEBSHOP_DATA naming a missing folder ended `agentq eval env=webshop` with a traceback (a
    FileNotFoundError; eval reports the env's ValueErrors as one line). The folder is no one split's:
    the line names the env, not split= (which blamed the split)."""
    from agentq.config import ConfigError, load_config
    from agentq.envs.webshop.data import WebShopDataError
    from agentq.eval.evaluate import evaluate

    assert issubclass(WebShopDataError, ValueError) and issubclass(WebShopDataError, FileNotFoundError)
    monkeypatch.setenv("WEBSHOP_DATA", str(tmp_path / "nowhere"))
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    cfg = load_config(["env=webshop", f"checkpoint={ckpt}", "device=cpu", f"eval.out_dir={tmp_path / 'out'}"])
    with pytest.raises(ConfigError) as e:
        evaluate(cfg)
    assert re.fullmatch(re.escape(
        f"env=webshop: WebShop data folder {str(tmp_path / 'nowhere')!r} does not exist (set WEBSHOP_DATA "
        "or data_dir to a folder with WebShop's files, or leave both unset for the generated catalog) (raised at ")
        + r"data\.py:\d+\)", str(e.value)), str(e.value)
    assert not (tmp_path / "out").exists()
    with pytest.raises(WebShopDataError, match=r"no WebShop product file \['items_shuffle_1000.json'"):
        get_shop(data_dir=str(tmp_path))


def test_spacy_tagger_without_spacy_is_refused_when_the_env_is_made():
    """noun_tagger='spacy' without spaCy's model was accepted, then raised a RuntimeError from step() at
    the first `Buy Now`: every episode that bought something was lost mid-run."""
    from agentq.envs.webshop import reward as rw

    try:
        rw._spacy_model()
    except ValueError:
        pass
    else:
        pytest.skip("spaCy and en_core_web_sm are installed here")
    with pytest.raises(ValueError, match=r"^noun_tagger='spacy' needs `pip install spacy` and the en_core_web_sm "
                                         r"model \((ModuleNotFoundError|OSError): .*\); valid noun_tagger values: "):
        gym.make("agentq/WebShop-v0", split="test", noun_tagger="spacy")


def test_an_unknown_variant_is_refused_on_the_generated_catalog_too(monkeypatch):
    """`variant=ful` ran on the generated catalog (which ignores variant) and was refused only with
    WEBSHOP_DATA set: a typo should fail alike whichever catalog is used, with the same message."""
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    for make in (lambda: get_shop(variant="ful"), lambda: WebShopEnv(variant="ful")):
        with pytest.raises(ValueError, match=re.escape("unknown WebShop data variant 'ful'; valid: ['1000', 'full']")):
            make()
    assert get_shop(variant="full") is get_shop(variant="1000") is get_shop()    # ignored, hence the same shop


def test_variant_and_price_seed_are_plain_config_keys_with_the_env_defaults():
    """docs/envs/webshop.md documents `variant` and `price_seed`, but `env.kwargs.variant=full` was
    refused as an unknown config key (only `+env.kwargs.variant=full` worked)."""
    import inspect

    from agentq.config import load_config

    defaults = inspect.signature(WebShopEnv.__init__).parameters
    kwargs = yaml.safe_load(CONF.read_text())["kwargs"]
    for key in ("variant", "price_seed"):
        assert kwargs[key] == defaults[key].default, key
    cfg = load_config(["env=webshop", "env.kwargs.variant=full", "env.kwargs.price_seed=3"])
    assert cfg.env.kwargs.variant == "full" and cfg.env.kwargs.price_seed == 3


def test_too_few_goals_hint_fits_the_shop_source(monkeypatch):
    """With real data the too-few-goals error advised raising goals_per_product, which acts on the
    generated catalog alone."""
    monkeypatch.setenv("WEBSHOP_DATA", str(FIXTURE))
    with pytest.raises(ValueError, match="has 5 goals") as real:
        WebShopEnv()
    assert "goals_per_product" not in str(real.value) and "num_products: null" in str(real.value)
    monkeypatch.delenv("WEBSHOP_DATA")
    with pytest.raises(ValueError, match="raise num_products / goals_per_product or lower split_sizes"):
        WebShopEnv(split_sizes={"test": 3000, "dev": 0})


def test_no_parsed_actions_advice_fits_a_run_from_a_checkpoint(capsys):
    """With model.path already set (an SFT checkpoint), the warning still said "start from an SFT
    checkpoint"; it now says that checkpoint does not follow the action format yet."""
    from agentq.config import load_config
    from agentq.trainer.rl import warn_no_parsed_actions

    warn_no_parsed_actions(load_config(["model.path=/ckpt/sft"]), 2, {"invalid_action_rate": 1.0})
    said = " ".join(capsys.readouterr().err.split())
    assert "model.path=/ckpt/sft does not follow the action format yet: more or better SFT" in said
    assert "start from an SFT checkpoint" not in said
    warn_no_parsed_actions(load_config([]), 2, {"invalid_action_rate": 1.0})
    assert "start from an SFT checkpoint" in capsys.readouterr().err


def test_train_leaves_out_a_goal_alike_to_a_held_out_one(env):
    """Goal 2250 asks what dev goal 773 asks (instruction, attributes, options, price limit; only the
    product id differs, which the reward never reads): training on it trains on a held-out task."""
    from agentq.envs.webshop.env import goal_signature, train_goals
    goals = env.unwrapped.shop.goals
    assert goal_signature(goals[2250]) == goal_signature(goals[773]) and goals[2250]["asin"] != goals[773]["asin"]
    held = {goal_signature(goals[i]) for i in range(1500)}
    train = [int(t) for t in env.unwrapped.list_tasks("train")]
    assert not any(goal_signature(goals[i]) in held for i in train)
    # alike goals within train stay (they leak nothing): 1900 ~ 1647, 2802 ~ 1630, 2961 ~ 2208
    assert {1647, 1900, 1630, 2802, 2208, 2961} <= set(train)
    assert train_goals(goals, range(0), range(1500, 3000)) == list(range(1500, 3000))
