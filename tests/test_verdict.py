import dataclasses

from chatgate.errors import Problem
from chatgate.profiles import generic_profile
from chatgate.verdict import Verdict


def test_without_problems_keeps_every_other_field() -> None:
    """A field added to Verdict and forgotten in without_problems fails here."""
    profile = generic_profile("deepseek-v4-flash")
    problem = Problem("reasoning_content_missing", "messages[2]", "missing", "R17")
    warning = Problem("unknown_model", "model", "warned", "R1", warning=True)
    values = {"problems": [problem], "warnings": [warning], "model": "deepseek-v4-flash", "stream": True,
              "thinking": True, "tools": True, "max_tokens": 77, "profile": profile, "media": False,
              "request": object(), "answers": [(2, {"role": "assistant"})]}
    assert set(values) == {f.name for f in dataclasses.fields(Verdict)}, "a new field: give it a value here"
    verdict = Verdict(**values)
    assert verdict.without_problems() == dataclasses.replace(verdict, problems=[])
    assert verdict.problems == [problem], "the original is unchanged"
