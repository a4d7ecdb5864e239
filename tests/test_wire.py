"""app/wire.py: pydantic's type errors as problems, bounded: a body with a great many bad items gets its
first problems, in time and memory that do not grow with the square of the body (found in review: 16,000
bad `stop` items took 42 s on the event loop, a million bad messages 2.7 GB)."""

from __future__ import annotations

import orjson
import pytest

from app.errors import MAX_PROBLEMS, APIError, Problem
from app.openai.rules import Policy, check_body
from app.wire import CUT_ITEMS, ERRORS_MAX, ancestors
from tests.anthropic.messages import check as check_messages


def chat(**extra: object) -> bytes:
    return orjson.dumps({"model": "deepseek-flash", "messages": [{"role": "user", "content": "x"}], **extra})


@pytest.mark.parametrize(("n", "found"), [(3000, 3000), (ERRORS_MAX + 1000, CUT_ITEMS)])  # the cut: above
def test_many_bad_items_give_the_first_problems_only(n: int, found: int) -> None:
    checked = check_body(chat(stop=[1] * n), Policy())
    assert [p.param for p in checked.problems] == [f"stop[{k}]" for k in range(found)]
    assert all(p.code == "invalid_type" for p in checked.problems)
    assert len(APIError.from_problems(checked.problems).body()["error"]["problems"]) == MAX_PROBLEMS


def test_many_bad_messages_on_the_anthropic_route_too() -> None:
    body = orjson.dumps({"model": "deepseek-flash", "max_tokens": 10,
                         "messages": [{"role": "user", "content": 1}] * (ERRORS_MAX + 10)})
    problems = check_messages(body).problems
    assert len(problems) == CUT_ITEMS and problems[0].param == "messages[0].content"


def test_a_union_still_reports_the_deeper_item_not_the_whole_value() -> None:
    (problem,) = check_body(chat(stop=["ok", 1]), Policy()).problems
    assert problem.param == "stop[1]"


def test_ancestors_are_the_proper_prefixes_of_each_path() -> None:
    assert ancestors(["stop[1]", "messages[2].content[0].text"]) == {
        "stop", "messages", "messages[2]", "messages[2].content", "messages[2].content[0]"}


def test_an_error_lists_at_most_max_problems_and_counts_the_rest() -> None:
    problems = [Problem("invalid_type", f"stop[{k}]", f"bad {k}", "R28") for k in range(MAX_PROBLEMS + 50)]
    error = APIError.from_problems(problems)
    assert len(error.body()["error"]["problems"]) == MAX_PROBLEMS
    assert f"{MAX_PROBLEMS + 49} more problem(s); the first {MAX_PROBLEMS} are listed" in error.message
