"""The Responses route's repairs as pure functions: each fixes only what it names, with the request's own
indices in its paths; the result passes chatgate's rules *and* the fake DeepSeek's own validation; a valid
request is never changed (property tests over Codex-shaped histories, and over the histories DeepSeek refuses:
chatgate finds every one of them)."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from chatgate.demo.responses import responses_error
from chatgate.repair.base import CATALOG, NAMES, RepairOptions
from chatgate.responses.repairs import HANDLES, reasoning_wanted, repair_responses, turn_of
from chatgate.verdict import Verdict
from tests.responses.items import (
    THOUGHT,
    assistant,
    call,
    check,
    developer,
    output,
    reasoning,
    request,
    summary,
    turn,
    user,
    warned,
)

EVERYTHING = RepairOptions(frozenset(NAMES))
DEFAULTS = RepairOptions()
PASSES = 3
REMEMBERED = orjson.dumps([reasoning("what chatgate relayed", "rs_old")]).decode()


def repaired(req: dict[str, Any], options: RepairOptions = EVERYTHING, recalled: dict[int, str] | None = None,
             strict: bool = False) -> tuple[dict[str, Any], list[tuple[str, str]], Verdict]:
    data = copy.deepcopy(req)
    applied: list[tuple[str, str]] = []
    verdict = check(data, strict=strict)
    for n in range(PASSES):
        done = repair_responses(data, [*verdict.problems, *verdict.warnings], options,
                                (recalled or {}) if n == 0 else {})
        if not done:
            break
        applied += [(a.code, a.path) for a in done]
        verdict = check(data, strict=strict)
    return data, applied, verdict


def test_the_catalog_and_the_handlers_agree() -> None:
    responses = {spec.name for spec in CATALOG if any(rule.startswith("P") for rule in spec.rules)}
    assert set(HANDLES) == responses
    defaults = {spec.name for spec in CATALOG if spec.default and spec.name in responses}
    assert defaults == {"responses_output_order", "responses_reasoning"}


# --- responses_output_order (P10) -------------------------------------------------------------------------


def test_an_output_after_a_hook_message_moves_before_it() -> None:
    """Codex Desktop's hook injects a developer message between a call and its output (DeepSeek-V3 #1588)."""
    req = request([user(), reasoning(), call("call_1"), developer(), output("call_1"), user("next")])
    data, applied, after = repaired(req, DEFAULTS)
    assert applied == [("responses_output_order", "input[4]")]
    assert [i.get("type") for i in data["input"]] == ["message", "reasoning", "function_call",
                                                       "function_call_output", "message", "message"]
    assert data["input"][4] == developer()
    assert summary(after) == [] and responses_error(data) is None


def test_outputs_of_a_parallel_batch_gather_after_it_in_call_order() -> None:
    req = request([user(), reasoning(), call("a"), call("b"), output("b"), developer(), user("hm"),
                   output("a")])
    data, applied, after = repaired(req, DEFAULTS)
    assert applied == [("responses_output_order", "input[7]")]
    assert [i.get("call_id") for i in data["input"][2:6]] == ["a", "b", "b", "a"]
    assert summary(after) == [] and responses_error(data) is None


def test_reasoning_stays_before_its_call_and_the_turns_are_split() -> None:
    req = request([user(), reasoning("first", "rs_a"), call("a"), reasoning("second", "rs_b"), call("b"),
                   output("a"), output("b")])
    data, applied, after = repaired(req, DEFAULTS)
    assert applied == [("responses_output_order", "input[5]")]
    assert [(i["type"], i.get("call_id") or i.get("id")) for i in data["input"][1:]] == [
        ("reasoning", "rs_a"), ("function_call", "a"), ("function_call_output", "a"), ("reasoning", "rs_b"),
        ("function_call", "b"), ("function_call_output", "b")]
    assert summary(after) == [] and responses_error(data) is None


def test_an_output_sent_before_its_call_moves_after_it() -> None:
    req = request([user(), output("call_1"), reasoning(), call("call_1"), user("go on")])
    data, applied, after = repaired(req, DEFAULTS)
    assert applied == [("responses_output_order", "input[1]")]
    kinds = [i.get("type") for i in data["input"]]
    assert kinds[1:4] == ["reasoning", "function_call", "function_call_output"]
    assert summary(after) == [] and responses_error(data) is None


def test_an_uncertain_layout_is_left_alone_unless_strict() -> None:
    search = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search"}}
    req = request([user(), reasoning(), call("c"), search, output("c")])
    data, applied, after = repaired(req, DEFAULTS)
    assert applied == [] and data == req
    assert warned(after) == [("tool_output_not_adjacent", "input[2]", "P10")]
    _, strict_applied, strict_after = repaired(req, DEFAULTS, strict=True)
    assert strict_applied == [("responses_output_order", "input[4]")] and summary(strict_after) == []


# --- responses_reasoning (P11) -----------------------------------------------------------------------------


def test_a_dropped_reasoning_item_is_put_back_from_memory() -> None:
    req = request([user(), call("call_1"), output("call_1"), user("next")])
    assert reasoning_wanted(req, check(req).problems, DEFAULTS) == {1: (("call_1",), ("shell",))}
    data, applied, after = repaired(req, DEFAULTS, recalled={1: REMEMBERED})
    assert applied == [("responses_reasoning", "input[1]")]
    assert data["input"][1] == reasoning("what chatgate relayed", "rs_old")
    assert summary(after) == [] and responses_error(data) is None


def test_an_emptied_reasoning_item_gets_its_content_back() -> None:
    req = request([user(), reasoning(None, "rs_client", summary=[]), call("call_1"), output("call_1")])
    assert reasoning_wanted(req, check(req).problems, DEFAULTS) == {1: (("call_1",), ("shell",))}
    data, applied, after = repaired(req, DEFAULTS, recalled={1: REMEMBERED})
    assert applied == [("responses_reasoning", "input[1].content")]
    assert data["input"][1]["id"] == "rs_client"
    assert data["input"][1]["content"] == [{"type": "reasoning_text", "text": "what chatgate relayed"}]
    assert summary(after) == []


def test_without_memory_a_summary_becomes_the_content_and_nothing_else_is_made_up() -> None:
    summarised = reasoning(None, summary=[{"type": "summary_text", "text": "**Plan**"},
                                          {"type": "summary_text", "text": "Run pytest."}])
    data, applied, after = repaired(request([user(), summarised, call("c"), output("c")]), DEFAULTS)
    assert applied == [("responses_reasoning", "input[1].content")]
    assert data["input"][1]["content"] == [{"type": "reasoning_text", "text": "**Plan**\n\nRun pytest."}]
    assert summary(after) == []
    bare = request([user(), call("c"), output("c")])
    data, applied, after = repaired(bare, DEFAULTS)
    assert applied == [] and data == bare
    assert summary(after) == [("reasoning_text_missing", "input[1]", "P11")]


def test_a_memory_without_text_is_not_used() -> None:
    empty = orjson.dumps([reasoning("", "rs_x")]).decode()
    req = request([user(), call("c"), output("c")])
    assert repaired(req, DEFAULTS, recalled={1: empty})[1] == []
    assert repaired(req, DEFAULTS, recalled={1: "not json"})[1] == []


def test_the_turn_of_a_reasoning_problem_names_its_calls() -> None:
    req = request([user(), reasoning(None), call("a"), call("b", name="apply"), output("a"), output("b")])
    problem = check(req).problems[0]
    assert turn_of(req, problem) == ("a", "b")
    assert reasoning_wanted(req, [problem], DEFAULTS) == {1: (("a", "b"), ("shell", "apply"))}
    assert reasoning_wanted(req, [problem], RepairOptions(frozenset())) == {}


# --- the opt-in ones ----------------------------------------------------------------------------------------


def test_openai_blobs_are_stripped_on_request_and_deepseeks_kept() -> None:
    own = "d8b79690-7c51-4f2e-9a1b-2f0c8d1e5a77-0"
    req = request([user(), reasoning(encrypted_content="gAAAAABo-x"), call("a"), output("a"),
                   reasoning(encrypted_content=own, rid="rs_2"), assistant(), user()])
    assert repaired(req, DEFAULTS)[1] == [], "off by default: DeepSeek ignores it"
    data, applied, after = repaired(req)
    assert applied == [("responses_strip_encrypted", "input[1].encrypted_content")]
    assert "encrypted_content" not in data["input"][1] and data["input"][4]["encrypted_content"] == own
    assert warned(after) == []


def test_orphan_and_heartbeat_outputs_are_dropped_on_request() -> None:
    heartbeat = {"type": "function_call_output", "id": "hb_1", "output": "alive"}
    req = request([user(), *turn("a"), heartbeat, output("automation_update"), user("next")])
    assert repaired(req, DEFAULTS)[1] == []
    data, applied, after = repaired(req)
    assert applied == [("responses_orphan_outputs", "input[4]"), ("responses_orphan_outputs", "input[5]")]
    assert len(data["input"]) == 5 and summary(after) == [] and responses_error(data) is None


def test_unanswered_calls_get_the_fixed_text_on_request() -> None:
    req = request([user(), reasoning(), call("a"), call("b"), output("a"), user("stop")])
    data, applied, after = repaired(req, RepairOptions(frozenset({"responses_unanswered_calls"}),
                                                         unanswered_tool_text="cancelled"))
    assert applied == [("responses_unanswered_calls", "input[3]")]
    assert data["input"][5] == {"type": "function_call_output", "call_id": "b", "output": "cancelled"}
    assert summary(after) == [] and responses_error(data) is None


def test_several_repairs_at_once_report_the_original_indices() -> None:
    heartbeat = {"type": "function_call_output", "id": "hb_1", "output": "alive"}
    req = request([user(), call("a"), developer(), output("a"), heartbeat, reasoning(), call("b"), user()])
    data, applied, after = repaired(req, recalled={1: REMEMBERED})
    assert sorted(applied) == [("responses_orphan_outputs", "input[4]"),
                               ("responses_output_order", "input[3]"), ("responses_reasoning", "input[1]"),
                               ("responses_unanswered_calls", "input[6]")]
    assert summary(after) == [] and responses_error(data) is None


# --- properties over Codex-shaped histories ----------------------------------------------------------------

CALL_NAMES = ("shell", "update_plan", "view_image")


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """What DeepSeek accepts: instructions-like developer and user messages, then rounds of thinking-mode
    turns (reasoning, maybe a commentary message, a batch of 1-3 calls, their outputs in any order;
    apply_patch calls; web searches), plain answers, and the user's next message."""
    items: list[dict[str, Any]] = []
    if draw(st.booleans()):
        items.append(developer("<permissions instructions>"))
    items.append(user(draw(st.sampled_from(["Fix it.", "Run the tests", "Refactor x"]))))
    n = 0
    for _ in range(draw(st.integers(0, 4))):
        n += 1
        text = draw(st.sampled_from([THOUGHT, "Look at the file first.", "日本語の推論"]))
        enc = draw(st.sampled_from([None, f"d8b79690-7c51-4f2e-9a1b-2f0c8d1e5a{n:02d}-0"]))
        items.append(reasoning(text, f"rs_{n}", **({"encrypted_content": enc} if enc else {})))
        if draw(st.booleans()):
            items.append({"type": "web_search_call", "id": f"ws_{n}", "status": "completed",
                          "action": {"type": "search", "query": "x"}})
        if draw(st.booleans()):
            items.append(assistant("Let me look."))
        kind = draw(st.sampled_from(["calls", "calls", "patch", "answer"]))
        if kind == "answer":
            items.append(assistant("Here it is."))
            items.append(user("And now?"))
            continue
        if kind == "patch":
            items += [{"type": "custom_tool_call", "call_id": f"call_p{n}", "name": "apply_patch",
                       "input": "*** Begin Patch\n*** End Patch"},
                      {"type": "custom_tool_call_output", "call_id": f"call_p{n}", "output": "Success."}]
            continue
        ids = [f"call_{n}_{k}" for k in range(draw(st.integers(1, 3)))]
        items += [call(i, draw(st.sampled_from(CALL_NAMES))) for i in ids]
        items += [output(i, draw(st.sampled_from(["ok", "", "exit 1"]))) for i in draw(st.permutations(ids))]
        if draw(st.booleans()):
            items.append(user("Also check the lint."))
    return items


def valid_request(items: list[dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    return request(items, **extra)


EXTRAS = st.fixed_dictionaries({}, optional={
    "store": st.just(False), "stream": st.booleans(), "include": st.just(["reasoning.encrypted_content"]),
    "prompt_cache_key": st.just("019a-conv"), "parallel_tool_calls": st.booleans(),
    "reasoning": st.sampled_from([{"effort": e, "summary": "auto"} for e in ("low", "high", "xhigh", "max")]),
    "instructions": st.just("You are Codex."), "max_output_tokens": st.integers(1, 393_216),
    "model": st.sampled_from(["deepseek-flash", "deepseek-v4-pro"]),
    "tool_choice": st.sampled_from(["auto", "none"]), "service_tier": st.just("auto"),
})


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=histories(), extra=EXTRAS)
def test_a_valid_request_is_never_changed_and_deepseek_accepts_it(items: list[dict[str, Any]],
                                                                  extra: dict[str, Any]) -> None:
    req = valid_request(items, extra)
    verdict = check(req, strict=True)
    assert summary(verdict) == [] and warned(verdict) == []
    data = copy.deepcopy(req)
    assert repair_responses(data, [], EVERYTHING, {}) == [] and data == req
    assert responses_error(req) is None, "the fake DeepSeek accepts it too"


MUTATIONS = ("hook_between", "drop_reasoning", "heartbeat", "orphan", "drop_output", "summary_only")


def mutate(items: list[dict[str, Any]], how: str, rnd: Any) -> tuple[list[dict[str, Any]], dict[int, str]]:
    """A history DeepSeek refuses, and what chatgate would recall for it."""
    items = copy.deepcopy(items)
    calls = [k for k, i in enumerate(items) if i.get("type") == "function_call"]
    turns = [k for k, i in enumerate(items) if i.get("type") == "reasoning"
             and any(j.get("type") == "function_call" for j in items[k + 1:k + 4])]
    if how == "hook_between" and calls:
        k = rnd.choice(calls)
        while k + 1 < len(items) and items[k + 1]["type"] == "function_call":
            k += 1
        items.insert(k + 1, developer())
    elif how in ("drop_reasoning", "summary_only") and turns:
        k = rnd.choice(turns)
        removed = items[k]
        if how == "drop_reasoning":
            del items[k]
        else:
            items[k] = {"type": "reasoning", "id": removed["id"],
                        "summary": [{"type": "summary_text", "text": "**Thinking**"}]}
        return items, {k: orjson.dumps([removed]).decode()}
    elif how == "heartbeat":
        heartbeat = {"type": "function_call_output", "id": "hb", "output": "."}
        items.insert(rnd.randrange(1, len(items) + 1), heartbeat)
    elif how == "orphan":
        items.insert(rnd.randrange(1, len(items) + 1), output("call_automation_update", "{}"))
    elif how == "drop_output" and calls:
        k = rnd.choice(calls)
        target = items[k]["call_id"]
        items = [i for i in items if not (i.get("type") == "function_call_output" and i["call_id"] == target)]
    return items, {}


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=histories(), how=st.sampled_from(MUTATIONS), rnd=st.randoms(use_true_random=False))
def test_what_deepseek_refuses_chatgate_refuses_and_the_repairs_fix_it(items: list[dict[str, Any]], how: str,
                                                                      rnd: Any) -> None:
    bad, recalled = mutate(items, how, rnd)
    req = request(bad)
    refused = responses_error(req)
    event(f"{how}: {'refused' if refused else 'accepted'}")
    if refused is None:
        return  # the mutation found nothing to break in this history
    verdict = check(req)
    assert verdict.problems, f"DeepSeek refuses it ({responses_error(req)}) and chatgate must too"
    wanted = reasoning_wanted(req, verdict.problems, EVERYTHING)
    memory = {i: recalled[k] for i in wanted for k in recalled if i == k}
    data, applied, after = repaired(req, EVERYTHING, recalled=memory)
    if how == "summary_only" or recalled:
        assert applied, how
    assert summary(after) == [], (how, applied)
    assert responses_error(data) is None, (how, responses_error(data))
