"""chatgate/wire.py: pydantic's type errors as problems, bounded: a body with a great many bad items gets its
first problems, in time and memory that do not grow with the square of the body (found in review: 16,000
bad `stop` items took 42 s on the event loop, a million bad messages 2.7 GB)."""

from __future__ import annotations

import orjson
import pytest

from chatgate.errors import MAX_PROBLEMS, APIError, Problem
from chatgate.openai.rules import check_body
from chatgate.rules.models import Policy
from chatgate.wire import CUT_ITEMS, ERRORS_MAX, ancestors
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


# --- validate_body: a large body is validated failing fast -------------------------------------------


def _history(n: int, bad_at: tuple[int, ...] = (), size: int = 120) -> dict[str, object]:
    """A long agent history (about `size` + 30 bytes a message), with a bad `content` at the given indices."""
    messages: list[dict[str, object]] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(1, n):
        role = "user" if i % 2 else "assistant"
        messages.append({"role": role, "content": 5 if i in bad_at else f"turn {i}: " + "x" * size})
    return {"model": "deepseek-flash", "messages": messages, "stop": ["END"], "temperature": 0.3,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}


@pytest.mark.parametrize("model_name", ["chat", "fim", "messages", "responses"])
def test_a_large_valid_body_gives_the_model_plain_validation_gives(model_name: str) -> None:
    from chatgate.anthropic.protocol import MessagesRequest
    from chatgate.fim.protocol import FimRequest
    from chatgate.openai.protocol import ChatCompletionRequest
    from chatgate.responses.protocol import ResponsesRequest
    from chatgate.wire import FULL_CHECK_BYTES, validate_body

    text = "y" * (FULL_CHECK_BYTES + 10)
    bodies = {
        "chat": (ChatCompletionRequest, {**_history(3000), "extra": {"ignored": True}}),
        "fim": (FimRequest, {"model": "deepseek-v4-flash", "prompt": text, "suffix": "}", "max_tokens": 9}),
        "messages": (MessagesRequest, {"model": "deepseek-flash", "max_tokens": 99, "system": [
            {"type": "text", "text": text}], "messages": [{"role": "user", "content": "hi"}]}),
        "responses": (ResponsesRequest, {"model": "deepseek-flash", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": text}]}], "stream": True}),
    }
    model, data = bodies[model_name]
    body = orjson.dumps(data)
    assert len(body) > FULL_CHECK_BYTES
    got, plain = validate_body(model, body), model.model_validate_json(body)
    assert type(got) is model
    assert got == plain and got.model_fields_set == plain.model_fields_set


@pytest.mark.slow  # 400,000 items validated: seconds of CPU
def test_a_large_body_of_bad_items_holds_one_error_not_one_per_item() -> None:
    import pydantic

    from chatgate.openai.protocol import ChatCompletionRequest
    from chatgate.wire import CUT_BODY_MAX, validate_body

    bad = {"model": "deepseek-flash", "messages": [{"role": "user", "content": 5}] * 400_000}
    body = orjson.dumps(bad)
    assert len(body) > CUT_BODY_MAX
    with pytest.raises(pydantic.ValidationError) as plain:
        ChatCompletionRequest.model_validate_json(body)
    assert plain.value.error_count() == 400_000  # what the fail-fast check avoids holding
    with pytest.raises(pydantic.ValidationError) as fast:
        validate_body(ChatCompletionRequest, body)
    assert fast.value.error_count() == 1
    assert fast.value.errors()[0]["loc"][:2] == ("messages", 0)


def test_a_large_invalid_body_lists_the_problems_among_its_first_items_when_the_cut_is_small() -> None:
    from chatgate.wire import FULL_CHECK_BYTES

    body = orjson.dumps(_history(1800, bad_at=(5, 9, 1500)))  # cut to 1,000 messages: under the bound
    assert len(body) > FULL_CHECK_BYTES
    checked = check_body(body, Policy())
    assert [p.param for p in checked.problems] == ["messages[5].content", "messages[9].content"]
    assert checked.request is None


def test_a_large_invalid_body_whose_cut_is_still_large_reports_its_first_problem() -> None:
    from chatgate.wire import CUT_ITEMS, FULL_CHECK_BYTES

    body = orjson.dumps(_history(900, bad_at=(700, 800), size=400))  # fewer messages than the cut
    assert len(body) > FULL_CHECK_BYTES and CUT_ITEMS > 900
    assert [p.param for p in check_body(body, Policy()).problems] == ["messages[700].content"]
