"""`agentq report`'s pieces computed without a browser (the rendered page: tests/trainer/test_run_outputs.py)."""
import re

from agentq.eval.report import by_turn_section, viewer_steps


def test_the_alpha_by_turn_table_shows_the_median_of_an_even_count():
    rows = [{"step": 1, "k3_by_turn": [0.1]}]
    # two trajectories' first turns: the median of α 0.5 and 0.9 is 0.7 (not the upper middle, 0.9)
    segs = {1: [{"turn": 1, "tokens": 3, "alpha": 0.5}, {"turn": 1, "tokens": 2, "alpha": 0.9},
                {"turn": 1, "tokens": 0, "alpha": 0.1}]}     # no action token: not counted
    table = re.search(r"<table id='alpha-by-turn'>.*?</table>", by_turn_section(rows, segs), re.S).group(0)
    assert re.findall(r"<td[^>]*>([^<]*)</td>", table)[1] == "0.700"


def test_viewer_steps_spread_over_the_run_for_every_k():
    steps = [1, 2, 3, 4, 5, 6, 7]
    assert viewer_steps(steps, 4) == [1, 3, 5, 7]
    assert viewer_steps(steps, 2) == [1, 7]
    assert viewer_steps(steps, 1) == [7]
    assert viewer_steps(steps, 0) == []
    assert viewer_steps([3], 4) == [3]
