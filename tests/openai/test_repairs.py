"""The chat repairs as pure functions: each fixes only the problems it names, where the result is valid;
a valid request is never changed (property), and a repaired request passes the rules (property)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chatgate.openai.chat import ChatFamily
from chatgate.openai.repairs import HANDLES, repair_chat
from chatgate.openai.rules import Checked
from chatgate.profiles import DEFAULT_PROFILES
from chatgate.repair.base import CATALOG, NAMES, RepairOptions
from chatgate.repair.loop import REPAIR_PASSES
from chatgate.rules.models import Policy
from tests.openai.conversations import TOOLS, assistant, call, calls, check, request, tool, user
from tests.openai.test_properties import examples

EVERYTHING = RepairOptions(frozenset(NAMES))
REASONING = "I should look it up."


def repaired(req: dict[str, Any], options: RepairOptions = EVERYTHING, recalled: dict[int, str] | None = None,
             strict: bool = False) -> tuple[dict[str, Any], list[tuple[str, str]], Checked]:
    """Check and repair until nothing more is repaired, as the gateway does (REPAIR_PASSES):
    (repaired request, [(code, path)], the last check)."""
    data = copy.deepcopy(req)
    profile = DEFAULT_PROFILES.get(req["model"])
    applied: list[tuple[str, str]] = []
    checked = check(data, strict=strict)
    for _ in range(REPAIR_PASSES):
        done = repair_chat(data, [*checked.problems, *checked.warnings], options, profile, recalled or {})
        if not done:
            break
        applied += [(a.code, a.path) for a in done]
        checked = check(data, strict=strict)
    return data, applied, checked


def test_the_catalog_and_the_handlers_agree() -> None:
    chat = {spec.name for spec in CATALOG if any(rule.startswith("R") for rule in spec.rules)}
    assert set(HANDLES) == chat
    assert {spec.name for spec in CATALOG if spec.default} == {
        "restore_reasoning", "restore_thinking", "thinking_conflict", "responses_output_order",
        "responses_reasoning", "system_messages", "split_tool_results", "empty_assistant", "model_suffix"}


def test_restore_reasoning_puts_back_what_was_recalled_r17() -> None:
    req = request([user(), calls(call("call_1"), reasoning=None), tool("call_1")], tools=TOOLS)
    data, applied, after = repaired(req, recalled={1: REASONING})
    assert applied == [("restore_reasoning", "messages[1]")]
    assert data["messages"][1]["reasoning_content"] == REASONING
    assert after.problems == []


def test_restore_reasoning_also_restores_a_warned_turn_of_a_request_without_tools_r17() -> None:
    """Without `tools`, R17 is a warning (docs/rules-chat.md U3); the gateway hands warnings to the repairs
    too, so a remembered turn is still put back and the request goes out without the warning."""
    req = request([user(), calls(call("call_1"), reasoning=None), tool("call_1"), assistant(),
                   user("Give this chat a title.")])
    before = check(req)
    assert before.problems == [] and [w.code for w in before.warnings] == ["reasoning_content_missing"]
    data, applied, after = repaired(req, recalled={1: REASONING})
    assert applied == [("restore_reasoning", "messages[1]")]
    assert data["messages"][1]["reasoning_content"] == REASONING
    assert after.problems == [] and after.warnings == []


def test_restore_reasoning_without_a_memory_changes_nothing_r17() -> None:
    req = request([user(), calls(call("call_1"), reasoning=None), tool("call_1")], tools=TOOLS)
    data, applied, after = repaired(req)
    assert applied == [] and data == req
    assert [p.code for p in after.problems] == ["reasoning_content_missing"]


def test_thinking_conflict_drops_the_effort_only_when_thinking_is_disabled_r41() -> None:
    req = request([user()], thinking={"type": "disabled"}, reasoning_effort="high")
    data, applied, after = repaired(req, RepairOptions())
    assert applied == [("thinking_conflict", "reasoning_effort")]
    assert "reasoning_effort" not in data and data["thinking"] == {"type": "disabled"}
    assert after.problems == [] and after.warnings == []
    _, applied, after = repaired(req, RepairOptions(), strict=True)  # an error in strict mode, repaired too
    assert applied == [("thinking_conflict", "reasoning_effort")] and after.problems == []


def test_developer_role_becomes_system_r5() -> None:
    req = request([{"role": "developer", "content": "Be brief."}, user()])
    data, applied, after = repaired(req)
    assert applied == [("developer_role", "messages[0]")]
    assert data["messages"][0] == {"role": "system", "content": "Be brief."}
    assert after.problems == []


def test_developer_role_with_text_parts_needs_flatten_content_too_r5_r6() -> None:
    dev = {"role": "developer",
           "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "x"}]}
    _, applied, after = repaired(request([dev, user()]), RepairOptions(frozenset({"developer_role"})))
    assert applied == [("developer_role", "messages[0]")]
    assert [(p.code, p.param) for p in after.problems] == [("content_not_string", "messages[0].content")]
    data, applied, after = repaired(request([dev, user()]))  # pass 2 flattens what pass 1 revealed
    assert applied == [("developer_role", "messages[0]"), ("flatten_content", "messages[0].content")]
    assert after.problems == [] and data["messages"][0] == {"role": "system", "content": "Be brief.\nx"}


def test_flatten_content_joins_text_parts_only_r6() -> None:
    parts = [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]
    req = request([{"role": "system", "content": parts}, user(), assistant(parts)], model="deepseek-v4-pro")
    data, applied, after = repaired(req)
    assert applied == [("flatten_content", "messages[0].content"), ("flatten_content", "messages[2].content")]
    assert data["messages"][0]["content"] == "line one\nline two"
    assert after.problems == []


def test_flatten_content_leaves_arrays_with_images_alone_r6() -> None:
    parts = [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]
    req = request([user(), calls(call("c1")), tool("c1", parts)], tools=TOOLS, model="deepseek-v4-pro")
    data, applied, after = repaired(req, RepairOptions(frozenset({"flatten_content"})))
    assert applied == [] and data == req
    assert [p.code for p in after.problems] == ["content_not_string"]


def test_strip_images_on_a_model_without_vision_r8() -> None:
    parts = [{"type": "text", "text": "what is this?"},
             {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]
    req = request([user(parts)], model="deepseek-v4-pro")
    data, applied, after = repaired(req)
    assert applied == [("strip_images", "messages[0].content[1]")]
    assert data["messages"][0]["content"][1] == {"type": "text", "text": EVERYTHING.image_placeholder}
    assert after.problems == []
    assert repaired(request([user(parts)], model="deepseek-flash"))[1] == []  # a vision model: untouched


def test_forced_tool_choice_disables_thinking_and_keeps_the_choice_r34() -> None:
    choice = {"type": "function", "function": {"name": "get_weather"}}
    req = request([user()], tools=TOOLS, tool_choice=choice, reasoning_effort="max")
    data, applied, after = repaired(req)
    assert applied == [("forced_tool_choice", "thinking")]
    assert data["thinking"] == {"type": "disabled"} and data["tool_choice"] == choice
    assert "reasoning_effort" not in data
    assert after.problems == [] and after.warnings == []


def test_clamp_max_tokens_only_lowers_r27() -> None:
    data, applied, after = repaired(request([user()], max_tokens=10**6))
    assert applied == [("clamp_max_tokens", "max_tokens")] and data["max_tokens"] == 393_216
    assert after.problems == []
    _, applied, after = repaired(request([user()], max_tokens=0))
    assert applied == [] and [p.code for p in after.problems] == ["max_tokens_out_of_range"]


def test_user_id_is_sanitised_and_truncated_r37() -> None:
    data, applied, after = repaired(request([user()], user_id="alice smith@corp/" + "x" * 600))
    assert applied == [("user_id", "user_id")]
    assert data["user_id"].startswith("alice_smith_corp_") and len(data["user_id"]) == 512
    assert after.problems == []


def test_orphan_tool_messages_are_dropped_r14_r15() -> None:
    msgs = [user(), tool("nobody"), calls(call("c1")), tool("c1"), tool("c9"), assistant()]
    data, applied, after = repaired(request(msgs, tools=TOOLS), strict=True)
    assert applied == [("orphan_tool_messages", "messages[1]"), ("orphan_tool_messages", "messages[4]")]
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert after.problems == []


def test_unanswered_tool_calls_get_a_tool_message_each_r16() -> None:
    msgs = [user(), calls(call("c1"), call("c2")), tool("c2"), user("and?"), calls(call("c3")), user("x")]
    data, applied, after = repaired(request(msgs, tools=TOOLS))
    assert applied == [("unanswered_tool_calls", "messages[1].tool_calls"),
                       ("unanswered_tool_calls", "messages[4].tool_calls")]
    assert [(m["role"], m.get("tool_call_id")) for m in data["messages"]] == [
        ("user", None), ("assistant", None), ("tool", "c2"), ("tool", "c1"), ("user", None),
        ("assistant", None), ("tool", "c3"), ("user", None)]
    assert data["messages"][3]["content"] == EVERYTHING.unanswered_tool_text
    assert after.problems == []


def test_an_unknown_id_with_a_call_unanswered_needs_both_structural_repairs_r15_r16() -> None:
    msgs = [user(), calls(call("c1")), tool("c9"), assistant()]
    data, applied, after = repaired(request(msgs, tools=TOOLS))
    assert applied == [("orphan_tool_messages", "messages[2]"),
                       ("unanswered_tool_calls", "messages[1].tool_calls")]
    assert [(m["role"], m.get("tool_call_id")) for m in data["messages"]] == [
        ("user", None), ("assistant", None), ("tool", "c1"), ("assistant", None)]
    assert after.problems == []


ORPHAN = RepairOptions(frozenset({"orphan_tool_messages"}))
UNANSWERED = RepairOptions(frozenset({"unanswered_tool_calls"}))
BOTH = RepairOptions(ORPHAN.enabled | UNANSWERED.enabled)


def test_a_warned_unknown_id_is_dropped_only_when_its_call_is_answered_r15_r16() -> None:
    """A tool message for each call, one with an id no call has: forwarded with warnings. Dropping that
    message alone would leave the call unanswered with too few tool messages, a certain R16: so
    orphan_tool_messages alone leaves it, and drops it when unanswered_tool_calls answers the call."""
    req = request([user(), calls(call("c1")), tool("c9"), assistant()], tools=TOOLS)
    before = check(req)
    assert before.problems == [] and [w.code for w in before.warnings] == [
        "unknown_tool_call_id", "tool_calls_unanswered"]
    data, applied, after = repaired(req, ORPHAN)
    assert applied == [] and data == req and after.problems == []
    data, applied, after = repaired(req, UNANSWERED)
    assert applied == [("unanswered_tool_calls", "messages[1].tool_calls")]
    assert [m.get("tool_call_id") for m in data["messages"]] == [None, None, "c9", "c1", None]
    assert after.problems == [] and after.warnings == []
    data, applied, after = repaired(req, BOTH)
    assert applied == [("orphan_tool_messages", "messages[2]"),
                       ("unanswered_tool_calls", "messages[1].tool_calls")]
    assert [m.get("tool_call_id") for m in data["messages"]] == [None, None, "c1", None]
    assert after.problems == [] and after.warnings == []


def test_a_refused_unknown_id_is_dropped_by_orphan_tool_messages_alone_r15() -> None:
    """With too few tool messages (or in strict mode) the unknown id is an error: dropping it is no loss."""
    unanswered = [("tool_calls_unanswered", "messages[1].tool_calls")]
    req = request([user(), calls(call("c1"), call("c2")), tool("c9"), tool("c2"), tool("c8"), assistant()],
                  tools=TOOLS)
    _, applied, after = repaired(req, ORPHAN, strict=True)
    assert applied == [("orphan_tool_messages", "messages[2]"), ("orphan_tool_messages", "messages[4]")]
    assert [(p.code, p.param) for p in after.problems] == unanswered
    few = request([user(), calls(call("c1"), call("c2")), tool("c9"), assistant()], tools=TOOLS)
    _, applied, after = repaired(few, ORPHAN)
    assert applied == [("orphan_tool_messages", "messages[2]")]
    assert [(p.code, p.param) for p in after.problems] == unanswered


def test_repairs_that_are_off_do_nothing() -> None:
    req = request([{"role": "developer", "content": "x"}, user()], max_tokens=10**6, user_id="a b")
    data, applied, _ = repaired(req, RepairOptions(frozenset()))
    assert applied == [] and data == req


def test_a_problem_no_repair_names_stays_a_problem() -> None:
    req = request([user()], n=3, max_tokens=10**6)
    _, applied, after = repaired(req)
    assert applied == [("clamp_max_tokens", "max_tokens")]
    assert [p.code for p in after.problems] == ["n_not_supported"]


# --- properties --------------------------------------------------------------------------------------

ROLES_WITH_PARTS = st.sampled_from(["system", "assistant", "tool"])


@st.composite
def broken_requests(draw: st.DrawFn) -> tuple[dict[str, Any], dict[int, str]]:
    """A valid tool-calling conversation with some repairable faults injected (R5, R6, R8, R14-R17, R27,
    R34, R37, R41), and the reasoning chatgate would recall for the turns whose reasoning was dropped."""
    model = draw(st.sampled_from(["deepseek-flash", "deepseek-v4-pro", "deepseek-v4-flash"]))
    rounds = draw(st.integers(1, 3))
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}, user()]
    recalled: dict[int, str] = {}
    for r in range(rounds):
        ids = [f"call_{r}_{k}" for k in range(draw(st.integers(1, 3)))]
        turn = calls(*(call(i) for i in ids))
        if draw(st.booleans()):
            del turn["reasoning_content"]
            recalled[len(msgs)] = REASONING
        msgs.append(turn)
        answered = draw(st.permutations(ids))
        keep = draw(st.integers(0 if draw(st.booleans()) else len(ids), len(ids)))
        msgs += [tool(i) for i in answered[:keep]]
        if draw(st.booleans()):
            msgs.append(tool("call_stray"))
        msgs.append(user(f"round {r}"))
    if draw(st.booleans()):
        msgs[0] = {"role": "developer", "content": msgs[0]["content"]}
    if draw(st.booleans()):
        msgs[0] = {**msgs[0], "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    if model == "deepseek-v4-pro" and draw(st.booleans()):
        msgs[1] = user([{"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "https://x.test/i.png"}}])
    extra: dict[str, Any] = {}
    if draw(st.booleans()):
        extra["max_tokens"] = draw(st.integers(393_217, 10**7))
    if draw(st.booleans()):
        extra["user_id"] = draw(st.sampled_from(["a b", "ü", "x" * 600, "ok-id"]))
    if draw(st.booleans()):
        extra["thinking"], extra["reasoning_effort"] = {"type": "disabled"}, "high"
    elif draw(st.booleans()):
        extra["tool_choice"] = "required"
    return request(msgs, model=model, tools=TOOLS, **extra), recalled


@examples(150)
@given(case=broken_requests(), strict=st.booleans())
def test_every_repairable_request_passes_the_rules_once_repaired(case: tuple[dict[str, Any], dict[int, str]],
                                                                  strict: bool) -> None:
    req, recalled = case
    _, applied, after = repaired(req, recalled=recalled, strict=strict)
    assert after.problems == [], (json.dumps(req), applied, [(p.code, p.param) for p in after.problems])


@examples(150)
@given(req=st.sampled_from([
    request([user()]),
    request([user(), calls(call("c1")), tool("c1"), assistant()], tools=TOOLS),
    request([user(), calls(call("c1"), call("c2")), tool("c2"), tool("c1")], tools=TOOLS, stream=True),
    request([user()], thinking={"type": "disabled"}, reasoning_effort="none"),
    request([user()], tools=[{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}]),
]), options=st.sets(st.sampled_from(NAMES)).map(lambda s: RepairOptions(frozenset(s))))
def test_a_valid_request_is_never_changed(req: dict[str, Any], options: RepairOptions) -> None:
    data, applied, after = repaired(req, options, recalled={1: "a different reasoning"})
    assert applied == [] and data == req and after.problems == []


@pytest.mark.parametrize("name", NAMES)
def test_each_repair_names_its_rules(name: str) -> None:
    spec = next(s for s in CATALOG if s.name == name)
    assert spec.rules and all(rule[0] in "RAP" and rule[1:].isdigit() for rule in spec.rules) and spec.what


# --- restore_reasoning on the body's bytes (ChatFamily.restore_in_place) ----------------------------------

CHAT = ChatFamily(Policy())
DEFAULTS = RepairOptions()


def in_place(body: bytes, recalled: dict[int, str]) -> bytes | None:
    """The in-place restore of `body` with these turns recalled; None where the family declines."""
    plan = CHAT.restore_in_place(body, CHAT.check(body, beta=False, origin=None), DEFAULTS)
    if plan is None:
        return None
    assert set(plan.wanted) == set(recalled)
    spliced, applied = plan.apply(recalled)
    assert [a.label() for a in applied] == [f"restore_reasoning@messages[{i}]" for i in sorted(recalled)]
    return spliced


def dropped(rounds: int, keep: set[int] = frozenset(), **extra: Any) -> tuple[dict[str, Any], dict[int, str]]:
    """An agent loop whose client dropped the reasoning of every turn but those in `keep`."""
    msgs: list[dict[str, Any]] = [user("Plan a trip: Paris, then Oslo. 日本語も")]
    recalled: dict[int, str] = {}
    for r in range(rounds):
        turn = calls(call(f"call_{r}"), reasoning=f"turn {r}: I should look it up." if r in keep else None)
        if r not in keep:
            recalled[len(msgs)] = f"turn {r}: \"quoted\", ünïcode and a \\ backslash"
        msgs += [turn, tool(f"call_{r}")]
    return request(msgs, tools=TOOLS, **extra), recalled


def test_in_place_restore_inserts_each_reasoning_and_keeps_every_other_byte_r17() -> None:
    req, recalled = dropped(3, keep={1})
    body = json.dumps(req, ensure_ascii=False).encode()  # ", " and ": " separators, as Python's json writes
    spliced = in_place(body, recalled)
    assert spliced is not None
    expected = copy.deepcopy(req)
    for i, text in recalled.items():
        expected["messages"][i]["reasoning_content"] = text
    assert json.loads(spliced) == expected
    assert CHAT.check(spliced, beta=False, origin=None).problems == []
    inserted = [f'"reasoning_content":{json.dumps(text, ensure_ascii=False)},'.encode()
                for text in recalled.values()]
    rest = spliced
    for piece in inserted:
        rest = rest.replace(piece, b"", 1)
    assert rest == body  # nothing else moved


def test_in_place_restore_of_some_turns_only_r17() -> None:
    req, recalled = dropped(3)
    body = json.dumps(req, separators=(",", ":")).encode()
    plan = CHAT.restore_in_place(body, CHAT.check(body, beta=False, origin=None), DEFAULTS)
    assert plan is not None and set(plan.wanted) == set(recalled)
    first = min(recalled)
    spliced, applied = plan.apply({first: "only this one"})
    assert [a.path for a in applied] == [f"messages[{first}]"]
    after = json.loads(spliced)
    assert after["messages"][first]["reasoning_content"] == "only this one"
    assert [p.param for p in CHAT.check(spliced, beta=False, origin=None).problems] == [
        f"messages[{i}].reasoning_content" for i in sorted(recalled) if i != first]


@pytest.mark.parametrize(("why", "change"), [
    ("another object has a tool_calls key (a tool's schema)",
     lambda b: b.replace(b'"properties":{', b'"properties":{"tool_calls":{"type":"string"},', 1)),
    ("the key is spelled with an escape", lambda b: b.replace(b'"tool_calls"', b'"tool\\u005fcalls"', 1)),
    ("the key has a space before its colon", lambda b: b.replace(b'"tool_calls":', b'"tool_calls" :', 1)),
    ("a turn has a null reasoning_content (inserting would make a duplicate key)",
     lambda b: b.replace(b'"tool_calls":', b'"reasoning_content":null,"tool_calls":', 1)),
    ("a message has the key twice",
     lambda b: b.replace(b'"tool_calls":', b'"tool_calls":[],"tool_calls":', 1)),
])
def test_in_place_restore_declines_where_the_place_is_not_certain_r17(why: str, change: Any) -> None:
    req, _ = dropped(2)
    body = change(json.dumps(req, separators=(",", ":")).encode())
    assert body != json.dumps(req, separators=(",", ":")).encode(), why
    verdict = CHAT.check(body, beta=False, origin=None)
    assert CHAT.restore_in_place(body, verdict, DEFAULTS) is None, why


def test_in_place_restore_is_not_used_when_another_problem_needs_a_repair() -> None:
    req, _ = dropped(1)
    req["messages"].insert(0, {"role": "developer", "content": "Be terse."})
    body = json.dumps(req).encode()
    options = RepairOptions(frozenset({"restore_reasoning", "developer_role"}))
    assert CHAT.restore_in_place(body, CHAT.check(body, beta=False, origin=None), options) is None


@st.composite
def dropped_turns(draw: st.DrawFn) -> tuple[dict[str, Any], dict[int, str], bool]:
    """An agent loop whose client dropped some turns' reasoning (nothing else wrong), with the reasoning
    chatgate would recall, written as clients write JSON; and whether it has nothing that makes the
    in-place restore decline (so it must be used)."""
    texts = st.sampled_from(["ok", "tool_calls", '{"tool_calls": []}', "naïve 日本", "a\\u0074b", ""])
    msgs: list[dict[str, Any]] = [user(draw(texts))]
    recalled: dict[int, str] = {}
    for r in range(draw(st.integers(1, 4))):
        ids = [f"call_{r}_{k}" for k in range(draw(st.integers(1, 3)))]
        drop = draw(st.booleans()) or (r == 0)
        turn = calls(*(call(i) for i in ids), content=draw(st.none() | texts),
                     reasoning=None if drop else "kept")
        if draw(st.booleans()):  # key order as another client writes it
            turn = dict(reversed(list(turn.items())))
        if drop:
            recalled[len(msgs)] = draw(st.sampled_from(["plain", 'with "quotes" and \\ and ünï', "x" * 300]))
        msgs.append(turn)
        msgs += [tool(i, draw(texts)) for i in ids]
    tools = copy.deepcopy(TOOLS)
    schema_key = draw(st.booleans()) and draw(st.booleans())
    if schema_key:
        tools[0]["function"]["parameters"]["properties"]["tool_calls"] = {"type": "string"}
    req = request(msgs, tools=tools)
    plain = not schema_key and not any(m.get("content") == "tool_calls" for m in msgs)
    return req, recalled, plain


@examples(150)
@given(case=dropped_turns(), compact=st.booleans(), ascii_only=st.booleans())
def test_in_place_restore_equals_the_parsed_repair_whenever_it_is_used(
        case: tuple[dict[str, Any], dict[int, str], bool], compact: bool, ascii_only: bool) -> None:
    """Wherever the family restores in place, the body means what restoring the parsed request gives;
    and a body with nothing doubtful is restored in place."""
    req, recalled, plain = case
    body = json.dumps(req, ensure_ascii=ascii_only, separators=(",", ":") if compact else None).encode()
    verdict = CHAT.check(body, beta=False, origin=None)
    assert {p.code for p in verdict.problems} == {"reasoning_content_missing"}
    plan = CHAT.restore_in_place(body, verdict, DEFAULTS)
    if plan is None:
        assert not plain or b"\\u00" in body, body
        return
    assert set(plan.wanted) == set(recalled)
    spliced, _ = plan.apply(recalled)
    data = json.loads(body)
    repair_chat(data, verdict.problems, DEFAULTS, DEFAULT_PROFILES.get(req["model"]), recalled)
    assert json.loads(spliced) == data
    assert CHAT.check(spliced, beta=False, origin=None).problems == []
