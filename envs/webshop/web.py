"""The shop as HTML pages on localhost: browse a goal by hand, or replay an episode step by step.

    python -m agentq.envs.webshop.web --port 3000            # then open http://127.0.0.1:3000/
    python -m agentq.envs.webshop.web --data-dir ~/webshop/data

Pages are rendered from the same `pages.El` elements as the text observations, so a person sees
exactly what an agent reads (the text of every page is at `<page url>/text`). Routes:

* `/`: splits and goals; `/goal/<split>/<task_id>`: a new session on that goal;
* `/s/<sid>`: the session's current page (buttons post `click[...]`, the search box `search[...]`);
* `/replay/<split>/<task_id>?actions=[...]&step=k`: the page after the first k actions of an episode
  (a JSON list of action strings), with the action list to step through; `/expert/<split>/<task_id>`
  replays the oracle's episode.

The server binds to loopback only (`serve` refuses any other host).
"""
from __future__ import annotations

import argparse
import ipaddress
import json
import threading
import uuid
from typing import Any, Callable
from urllib.parse import quote

from flask import Flask, Response, abort, redirect, request
from markupsafe import escape

from .env import WebShopEnv
from .experts import oracle_action
from .pages import DONE, El, Session

STYLE = """
body{font-family:sans-serif;max-width:960px;margin:20px auto;color:#222}
.btn{margin:2px;padding:4px 10px;border:1px solid #468;background:#eef4fb;cursor:pointer;border-radius:4px}
.option{border-color:#999;background:#fff}.option.selected{background:#246;color:#fff}
.buy{background:#f0a020;border-color:#b70}
.product{border-top:1px solid #ddd;padding:6px 0}.product-title{font-weight:bold}
#instruction-text{background:#fafae8;padding:8px;border:1px solid #dd9}
.inline{display:inline}.bar{background:#eee;padding:6px;margin-bottom:10px;font-size:90%}
.feedback{color:#a00}.steps li.current{font-weight:bold}
"""


def render_page(elements: list[El], action_url: str | None) -> str:
    """HTML for a page's elements; with `action_url=None` (replays, the done page) nothing is active."""

    def clickable(el: El, css: str) -> str:
        if action_url is None:
            return f'<span class="{css}">{escape(el.text)}</span>'
        return (f'<form class="inline" method="post" action="{action_url}"><button type="submit" class="{css}" '
                f'name="action" value="click[{escape(el.click)}]">{escape(el.text)}</button></form>')

    out = []
    for el in elements:
        k, t = el.kind, escape(el.text)
        if k == "button" and el.click == "search":
            continue                       # the search form below has its own submit button
        if k == "logo":
            out.append(f"<h2>{t}</h2>")
        elif k == "instruction_label":
            out.append('<div id="instruction-text"><b>Instruction:</b><br>')
        elif k == "instruction":
            out.append(f'<span id="instruction">{t}</span></div>')
        elif k == "search_box":
            out.append(f'<form method="post" action="{action_url}"><input id="search_input" name="search_query" '
                       f'size="60" placeholder="Search..." required> <button class="btn" type="submit">Search</button>'
                       f'</form>' if action_url else '<div><i>[search box]</i></div>')
        elif k == "button":
            out.append(clickable(el, "btn buy" if el.click == "buy now" else "btn"))
        elif k == "page_info":
            out.append(f"<h3>{t}</h3>")
        elif k == "product_link":
            out.append(f'<div class="product">{clickable(el, "btn product-link")}')
        elif k == "product_title":
            out.append(f'<div class="product-title">{t}</div>')
        elif k == "product_price":
            out.append(f'<div class="product-price">{t}</div></div>')
        elif k == "option_name":
            out.append(f'<h4 class="option-name">{t}</h4>')
        elif k == "option":
            out.append(clickable(el, "btn option selected" if el.selected else "btn option"))
        elif k in ("item_title", "done"):
            out.append(f"<h2>{t}</h2>")
        elif k in ("item_price", "item_rating", "done_label"):
            out.append(f"<h4>{t}</h4>")
        elif k == "done_score":
            out.append(f'<h3 id="reward">{t}</h3>')
        else:
            out.append(f'<p class="{k}">{t}</p>')
    return "\n".join(out)


def _html(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<link rel='icon' href='data:,'><style>{STYLE}</style></head><body>{body}</body></html>")


class _ShopSite:
    """The site's views over one shop: the goal list, live sessions (one per browser visit),
    replays of an action list, and the oracle's actions for a goal."""

    def __init__(self, env: WebShopEnv):
        self.env = env
        self.sessions: dict[str, dict] = {}
        self.lock = threading.Lock()

    def routes(self) -> list[tuple[str, Callable[..., Any], list[str]]]:
        """(URL rule, view, HTTP methods) of every page."""
        return [("/", self.index, ["GET"]), ("/go", self.go, ["GET"]),
                ("/goal/<split>/<task_id>", self.new_session, ["GET"]), ("/s/<sid>", self.show, ["GET"]),
                ("/s/<sid>", self.act, ["POST"]), ("/s/<sid>/text", self.show_text, ["GET"]),
                ("/replay/<split>/<task_id>", self.show_replay, ["GET"]),
                ("/expert/<split>/<task_id>", self.expert, ["GET"])]

    def goal_of(self, split: str, task_id: str) -> dict:
        if split not in self.env.splits or task_id not in self.env.list_tasks(split):
            abort(404, f"unknown goal {split}/{task_id}; splits: {list(self.env.splits)}")
        return self.env.shop.goals[int(task_id)]

    def replay(self, split: str, task_id: str, actions: list[str], k: int) -> tuple[Session, list]:
        s = Session(self.env.shop, self.goal_of(split, task_id))
        log = []
        for a in actions[:k]:
            out = s.step(a)
            log.append(out)
            if out.done:
                break
        return s, log

    def get_state(self, sid: str) -> dict:
        if sid not in self.sessions:
            abort(404, f"unknown session {sid}")
        return self.sessions[sid]

    def index(self) -> str:
        env, rows = self.env, []
        for split in env.splits:
            ids = env.list_tasks(split)
            links = " ".join(f'<a href="/goal/{split}/{i}">{i}</a>' for i in ids[:10])
            rows.append(f"<li><b>{split}</b> ({len(ids)} goals, ids {ids[0]}–{ids[-1]}): {links} …</li>")
        form = ('<form method="get" action="/go">split <select name="split">'
                + "".join(f"<option>{s}</option>" for s in env.splits)
                + '</select> goal <input name="task_id" size="6"> <button class="btn">open</button></form>')
        body = (f"<h2>WebShop (agentq)</h2><p>shop: {escape(env.shop.source)}, {len(env.shop.products)} products, "
                f"{len(env.shop.goals)} goals</p><ul>{''.join(rows)}</ul>{form}")
        return _html("WebShop", body)

    def go(self) -> Any:
        return redirect(f"/goal/{request.args.get('split', 'test')}/{request.args.get('task_id', '0')}")

    def new_session(self, split: str, task_id: str) -> Any:
        sid = uuid.uuid4().hex[:12]
        with self.lock:
            self.sessions[sid] = {"session": Session(self.env.shop, self.goal_of(split, task_id)), "split": split,
                                  "task_id": task_id, "actions": [], "feedback": ""}
        return redirect(f"/s/{sid}")

    def show(self, sid: str) -> str:
        st = self.get_state(sid)
        s: Session = st["session"]
        acts = json.dumps(st["actions"])
        bar = (f'<div class="bar">goal {st["split"]}/{st["task_id"]} · step {len(st["actions"])} · '
               f'<a href="/s/{sid}/text">text</a> · <a href="/replay/{st["split"]}/{st["task_id"]}'
               f'?actions={quote(acts)}">replay</a> · <a href="/">all goals</a>'
               + (f' · <span class="feedback">{escape(st["feedback"])}</span>' if st["feedback"] else "") + "</div>")
        return _html("WebShop", bar + render_page(s.elements(), None if s.page == DONE else f"/s/{sid}"))

    def act(self, sid: str) -> Any:
        st = self.get_state(sid)
        query = request.form.get("search_query")
        action = f"search[{query}]" if query is not None else request.form.get("action", "")
        with self.lock:
            out = st["session"].step(action)
            st["actions"].append(action)
            st["feedback"] = "" if out.valid else f"invalid action {action!r}: {out.feedback}"
        return redirect(f"/s/{sid}")

    def show_text(self, sid: str) -> Response:
        return Response(self.get_state(sid)["session"].text(), mimetype="text/plain")

    def show_replay(self, split: str, task_id: str) -> str:
        try:
            actions = json.loads(request.args.get("actions", "[]"))
            assert isinstance(actions, list) and all(isinstance(a, str) for a in actions)
        except (ValueError, AssertionError):
            abort(400, "actions must be a JSON list of action strings")
        step = request.args.get("step", str(len(actions)))
        if not step.lstrip("-").isdigit():
            abort(400, f"step must be an integer (the number of actions to replay), got {step[:40]!r}")
        k = max(0, min(int(step), len(actions)))
        s, log = self.replay(split, task_id, actions, k)
        base = f"/replay/{split}/{task_id}?actions={quote(json.dumps(actions))}&step="
        items = [f'<li class="{"current" if i == k else ""}"><a href="{base}{i}">{i}. '
                 f'{escape(actions[i - 1]) if i else "(start)"}</a></li>' for i in range(len(actions) + 1)]
        status = f" · reward {s.reward}" if s.page == DONE else ""
        nav = (f' · <a id="prev-step" href="{base}{k - 1}">‹ prev step</a>' if k > 0 else "") + (
            f' · <a id="next-step" href="{base}{k + 1}">next step ›</a>' if k < len(actions) else "")
        bar = (f'<div class="bar">replay of goal {split}/{task_id} · after {len(log)} of {len(actions)} actions'
               f'{status}{nav}</div>')
        body = (f'{bar}<div style="display:flex;gap:20px"><div style="flex:3">{render_page(s.elements(), None)}</div>'
                f'<ul class="steps" style="flex:1;list-style:none">{"".join(items)}</ul></div>')
        return _html("WebShop replay", body)

    def expert(self, split: str, task_id: str) -> Any:
        s = Session(self.env.shop, self.goal_of(split, task_id))
        actions: list[str] = []
        while s.page != DONE and len(actions) < 50:
            a = oracle_action(s)
            if a is None:                  # the oracle has no move (never on a generated shop)
                break
            actions.append(a)
            s.step(a)
        return redirect(f"/replay/{split}/{task_id}?actions={quote(json.dumps(actions))}&step=0")


def create_app(**env_kwargs: Any) -> Flask:
    """A Flask app serving the shop that `WebShopEnv(**env_kwargs)` would build.

    Args:
        env_kwargs: `WebShopEnv` arguments (data, split, seeds, ...).
    Returns:
        The app; `app.config["webshop_env"]` is its environment.
    """
    site = _ShopSite(WebShopEnv(**env_kwargs))
    app = Flask("agentq-webshop")
    for rule, view, methods in site.routes():
        app.add_url_rule(rule, view.__name__, view, methods=methods)
    app.config["webshop_env"] = site.env
    return app


def check_loopback(host: str) -> None:
    try:
        ok = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"the WebShop web view serves on loopback only; got host {host!r} (use 127.0.0.1)")


def make_server(host: str = "127.0.0.1", port: int = 3000, **env_kwargs):
    """A werkzeug server (call `.serve_forever()`; `.server_port` is the port, useful with port=0)."""
    from werkzeug.serving import make_server as _make_server
    check_loopback(host)
    return _make_server(host, port, create_app(**env_kwargs), threaded=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=3000)
    ap.add_argument("--data-dir", default=None, help="folder with WebShop's real files (default: $WEBSHOP_DATA, "
                    "else the generated catalog)")
    ap.add_argument("--num-products", type=int, default=None,
                    help="generated catalog size (default 1000); with real data, the first N products (default all)")
    ap.add_argument("--catalog-seed", type=int, default=0)
    args = ap.parse_args(argv)
    server = make_server(args.host, args.port, data_dir=args.data_dir, num_products=args.num_products,
                         catalog_seed=args.catalog_seed)
    print(f"WebShop web view on http://{args.host}:{server.server_port}/", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
