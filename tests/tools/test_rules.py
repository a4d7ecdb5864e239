"""The tool APIs' rules T1-T8 as pure functions (docs/rules-tools.md), the multipart reading behind the
uploads' checks, and what an answer is billed for (chatgate/tools/answers.py)."""

from __future__ import annotations

import httpx2
import orjson
import pytest

from chatgate.metering.calls import ToolUnits
from chatgate.tools.answers import billed_units
from chatgate.tools.family import ToolFamily
from chatgate.tools.multipart import parts
from chatgate.tools.rules import ASR_FILE_MAX, OCR_FILE_MAX, check_asr, check_fetch, check_ocr, check_search

MiB = 1024 * 1024


def form(file: bytes | None, **fields: str) -> bytes:
    """A multipart body as httpx (and so the SDKs) writes it."""
    files = {"file": ("scan.pdf", file, "application/pdf")} if file is not None else None
    request = httpx2.Request("POST", "http://x/", files=files or {"x": (None, "")}, data=fields)
    return request.read()


def codes(found: list) -> list[tuple[str, str | None, bool]]:  # type: ignore[type-arg]
    return [(p.code, p.rule, p.warning) for p in found]


def test_search_query_and_count_within_their_documented_ranges() -> None:
    assert check_search({"query": "q"}) == [] and check_search({"query": "界" * 128, "count": 50}) == []
    assert codes(check_search({"query": "q" * 129})) == [("invalid_query", "T2", False)]
    assert codes(check_search({"count": 3})) == [("missing_required_parameter", "T2", False)]
    assert codes(check_search({"query": 7})) == [("invalid_type", "T2", True)]
    assert codes(check_search({"query": "q", "count": 0})) == [("invalid_count", "T3", False)]
    assert codes(check_search({"query": "q", "count": True})) == [("invalid_type", "T3", True)]
    assert check_search({"query": "q", "count": None, "localization": "zh-CN", "unknown": {}}) == []


def test_fetch_url_length() -> None:
    assert check_fetch({"url": "u" * 8192}) == []
    assert codes(check_fetch({"url": "u" * 8193})) == [("invalid_url", "T4", False)]
    assert codes(check_fetch({"url": ["u"]})) == [("invalid_type", "T4", True)]
    assert codes(check_fetch({})) == [("missing_required_parameter", "T4", False)]


def test_multipart_parts_are_found_where_they_are() -> None:
    body = form(b"%PDF\r\n--not-the-boundary\r\n", purpose="text_recognition")
    found = parts(body)
    assert found is not None
    by_name = {p.name: p for p in found}
    assert body[by_name["file"].start:by_name["file"].end] == b"%PDF\r\n--not-the-boundary\r\n"
    assert by_name["file"].filename == "scan.pdf"
    assert body[by_name["purpose"].start:by_name["purpose"].end] == b"text_recognition"
    assert parts(b'{"file": 1}') is None and parts(body[:-10]) is None, "not multipart, or cut short"


def test_ocr_file_size_purpose_and_shape() -> None:
    assert check_ocr(form(b"x", purpose="rich_layout_recognition")) == []
    assert codes(check_ocr(form(b"x", purpose="handwriting"))) == [("unknown_purpose", "T7", True)]
    assert codes(check_ocr(form(None, purpose="text_recognition"))) == [
        ("missing_required_parameter", "T5", False)]
    assert codes(check_ocr(b'{"file": "x"}')) == [("not_multipart", "T5", True)]


@pytest.mark.slow  # two bodies of 100 MiB
def test_an_ocr_file_of_100_mib_passes_and_one_byte_more_is_refused() -> None:
    assert check_ocr(form(b"\0" * OCR_FILE_MAX, purpose="text_recognition")) == []
    assert codes(check_ocr(form(b"\0" * (OCR_FILE_MAX + 1), purpose="text_recognition"))) == [
        ("file_too_large", "T6", False)]


def test_asr_audio_size() -> None:
    assert check_asr(form(b"\0" * ASR_FILE_MAX)) == []
    assert codes(check_asr(form(b"\0" * (ASR_FILE_MAX + 1)))) == [("file_too_large", "T8", False)]
    assert codes(check_asr(form(None))) == [("missing_required_parameter", "T5", True)]


def test_the_family_turns_warnings_into_refusals_in_strict_mode() -> None:
    body = orjson.dumps({"query": "q", "count": "5"})
    lenient = ToolFamily("search").check(body, beta=False, origin=None)
    strict = ToolFamily("search", strict=True).check(body, beta=False, origin=None)
    assert (lenient.problems, [p.code for p in lenient.warnings], lenient.model) == (
        [], ["invalid_type"], "search")
    assert ([p.code for p in strict.problems], strict.warnings) == (["invalid_type"], [])
    not_object = ToolFamily("tts").check(b"[1]", beta=False, origin=None)
    assert [p.code for p in not_object.problems] == ["invalid_json"]


@pytest.mark.parametrize(("tool", "answer", "request_body", "units"), [
    ("search", {"results": [{"title": "a"}, {"title": "b"}]}, {}, ToolUnits("search", 1)),
    ("search", {"results": []}, {}, ToolUnits("search", 0)),
    ("search", {"hits": [1]}, {}, ToolUnits("search", 1, estimated=True)),
    ("fetch", {"content": "# page"}, {}, ToolUnits("fetch", 1)),
    ("fetch", {"content": "  "}, {}, ToolUnits("fetch", 0)),
    ("ocr", {"pages": [{}, {}, {}]}, {}, ToolUnits("ocr", 3)),
    ("ocr", {"usage": {"pages": 4}}, {}, ToolUnits("ocr", 4, estimated=True)),
    ("tts", None, {"input": "héllo"}, ToolUnits("tts", 5, estimated=True)),
    ("asr", {"text": "hi"}, {}, ToolUnits("asr", 0)),
])
def test_what_an_answer_is_billed_for(tool: str, answer: object, request_body: dict[str, object],
                                      units: ToolUnits) -> None:
    raw = orjson.dumps(answer) if answer is not None else b"ID3 audio"
    assert billed_units(tool, request_body, b"\n\n" + raw if tool == "ocr" else raw) == units
    assert billed_units("fetch", {}, b"# Markdown itself") == ToolUnits("fetch", 1)
