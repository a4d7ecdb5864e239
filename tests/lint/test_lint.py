"""`chatgate lint FILE…`: the proxy's request checks, offline, on a JSON body, a JSONL file of bodies and an
OpenAI batch-input file. Human output names file:line, custom_id, param, code (with its rule) and message;
`--format json` is for machines; exit 1 when any problem, 0 when all are valid; `--fix` writes the repaired
bodies. No socket is ever opened."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chatgate.cli import main
from chatgate.lint import run_lint
from chatgate.rules.models import Policy
from tests.harness import REPO_ROOT

GOOD = {
    "model": "deepseek-chat",
    "messages": [
        {"role": "system", "content": "You write release notes."},
        {"role": "user", "content": "Summarise: fixed login bug, faster search."},
    ],
    "max_tokens": 200,
}
HOT = {**GOOD, "temperature": 7}  # R25: temperature in [0, 2]
EMPTY = {"model": "deepseek-chat", "messages": []}  # R4: at least one message
STRINGY_N = {**GOOD, "n": "two"}  # R38: type error


class NetworkUsed(AssertionError):
    pass


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every test here fails if the linter tries to open a connection or resolve a name."""
    attempts: list[Any] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(args)
        raise NetworkUsed(f"chatgate lint tried to use the network: {args[1:]!r}")

    for name in ("connect", "connect_ex", "sendto"):
        monkeypatch.setattr(socket.socket, name, refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    for name in [n for n in os.environ if n.startswith("CHATGATE_")]:
        monkeypatch.delenv(name)
    return attempts


def lint(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    code = main(["lint", *map(str, args)])
    out = capsys.readouterr()
    assert out.err == ""
    return code, out.out


def jsonl(path: Path, *rows: Any) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def batch_line(
    custom_id: str, body: Any, url: str = "/v1/chat/completions", method: str = "POST"
) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": method, "url": url, "body": body}


# --- a single JSON body ---------------------------------------------------------------------------------


def test_valid_json_body_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "request.json"
    path.write_text(json.dumps(GOOD, indent=2))
    code, out = lint(capsys, path)
    assert code == 0
    assert out == "1 checked, 0 invalid\n"


def test_invalid_json_body_names_file_line_param_code_rule_and_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "request.json"
    path.write_text("\n" + json.dumps(HOT, indent=2))  # pretty-printed, starting on line 2
    code, out = lint(capsys, path)
    assert code == 1
    first = out.splitlines()[0]
    assert first.startswith(f"{path}:2: temperature: out_of_range [R25]: ")
    assert "got 7" in first
    assert out.endswith("1 checked, 1 invalid\n")


def test_not_json_at_all_is_reported_not_crashed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "request.json"
    path.write_text("model: deepseek-chat\n")
    code, out = lint(capsys, path)
    assert code == 1 and f"{path}:1: (body): invalid_json [R1]: " in out


# --- JSONL of bodies ------------------------------------------------------------------------------------


def test_jsonl_reports_each_bad_line_with_its_line_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = jsonl(tmp_path / "requests.jsonl", GOOD, HOT, "", EMPTY, "{broken", STRINGY_N)
    code, out = lint(capsys, path)
    assert code == 1
    lines = out.splitlines()
    assert lines[-1] == "5 checked, 4 invalid"
    assert lines[0].startswith(f"{path}:2: temperature: out_of_range [R25]: ")
    assert lines[1].startswith(f"{path}:4: messages: empty_array [R4]: ")
    assert lines[2].startswith(f"{path}:5: (body): invalid_json [R1]: ")
    assert lines[3].startswith(f"{path}:6: n: invalid_type [R38]: ")
    assert not any(f"{path}:1:" in line for line in lines), "line 1 is valid"


def test_all_valid_jsonl_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = jsonl(tmp_path / "requests.jsonl", GOOD, {**GOOD, "stream": True}, {**GOOD, "temperature": 0.2})
    assert lint(capsys, path) == (0, "3 checked, 0 invalid\n")


# --- OpenAI batch-input files ---------------------------------------------------------------------------


def test_batch_file_names_the_custom_id(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = jsonl(
        tmp_path / "batch.jsonl",
        batch_line("release-notes-1", GOOD),
        batch_line("release-notes-2", HOT),
        batch_line("release-notes-3", EMPTY),
    )
    code, out = lint(capsys, path)
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"{path}:2 (custom_id release-notes-2): temperature: out_of_range [R25]: ")
    assert lines[1].startswith(f"{path}:3 (custom_id release-notes-3): messages: empty_array [R4]: ")
    assert lines[-1] == "3 checked, 2 invalid"


def test_batch_lines_with_wrong_url_method_or_no_body(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = jsonl(
        tmp_path / "batch.jsonl",
        batch_line("emb", GOOD, url="/v1/embeddings"),
        batch_line("get", GOOD, method="GET"),
        {"custom_id": "nobody", "method": "POST", "url": "/v1/chat/completions"},
    )
    code, out = lint(capsys, path)
    assert code == 1
    assert f"{path}:1 (custom_id emb): (body): invalid_batch_line: url '/v1/embeddings'" in out
    assert f"{path}:2 (custom_id get): (body): invalid_batch_line: method 'GET'" in out
    assert f"{path}:3 (custom_id nobody): (body): invalid_batch_line: batch line has no 'body'" in out


def test_valid_batch_file_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = jsonl(tmp_path / "batch.jsonl", *(batch_line(f"q{i}", GOOD) for i in range(5)))
    assert lint(capsys, path) == (0, "5 checked, 0 invalid\n")


# --- machine output, several files, config --------------------------------------------------------------


def test_json_format_is_machine_readable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch = jsonl(tmp_path / "batch.jsonl", batch_line("a", GOOD), batch_line("b", HOT))
    single = tmp_path / "one.json"
    single.write_text(json.dumps(EMPTY))
    code = main(["lint", "--format", "json", str(batch), str(single)])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert (report["checked"], report["invalid"]) == (3, 2)
    ok, hot, empty = report["results"]
    assert ok == {
        "where": f"{batch}:1 (custom_id a)",
        "file": str(batch),
        "line": 1,
        "custom_id": "a",
        "valid": True,
        "problems": [],
        "warnings": [],
    }
    assert (hot["file"], hot["line"], hot["custom_id"], hot["valid"]) == (str(batch), 2, "b", False)
    assert hot["problems"] == [
        {
            "code": "out_of_range",
            "param": "temperature",
            "rule": "R25",
            "message": hot["problems"][0]["message"],
        }
    ]
    assert "[0, 2]" in hot["problems"][0]["message"]
    assert (empty["file"], empty["line"], empty["custom_id"]) == (str(single), 1, None)
    assert empty["problems"][0]["code"] == "empty_array"


def test_json_format_all_valid_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = jsonl(tmp_path / "requests.jsonl", GOOD)
    assert main(["lint", "--format", "json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["invalid"] == 0


def test_one_bad_file_among_good_ones_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = jsonl(tmp_path / "good.jsonl", GOOD)
    bad = jsonl(tmp_path / "bad.jsonl", GOOD, HOT)
    code, out = lint(capsys, good, bad)
    assert code == 1 and str(good) not in out and f"{bad}:2:" in out


def test_missing_or_empty_file_is_a_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    code, out = lint(capsys, tmp_path / "missing.json", empty)
    assert code == 1
    assert f"{tmp_path / 'missing.json'}: (body): unreadable: cannot read file" in out
    assert f"{empty}: (body): unreadable: empty file" in out


def test_lint_applies_the_configured_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The config file's validation settings apply to lint: a model DeepSeek does not serve is refused by
    default, and passes when the configuration names it (validation.extra_models) or only warns."""
    body = tmp_path / "request.json"
    body.write_text(json.dumps({**GOOD, "model": "gpt-4o"}))
    code, out = lint(capsys, body)
    assert code == 1 and f"{body}:1: model: " in out and "did you mean 'deepseek-flash'" in out
    for setting in ('extra_models = ["gpt-4o"]', 'unknown_models = "warn"'):
        config = tmp_path / "chatgate.toml"
        config.write_text(f"[validation]\n{setting}\n")
        assert main(["lint", "--config", str(config), str(body)]) == 0, setting
        capsys.readouterr()


def test_bom_and_crlf_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "windows.jsonl"
    path.write_bytes(
        b"\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\r\n" + json.dumps(HOT).encode() + b"\r\n"
    )
    code, out = lint(capsys, path)
    assert code == 1 and out.splitlines()[-1] == "2 checked, 1 invalid" and f"{path}:2: temperature" in out


def test_no_socket_is_opened(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_network: list[Any]
) -> None:
    """The guard works (a connect raises and is recorded) and a full lint run makes no attempt."""
    with pytest.raises(NetworkUsed):
        socket.create_connection(("127.0.0.1", 9))
    no_network.clear()
    path = jsonl(
        tmp_path / "mix.jsonl", GOOD, HOT, batch_line("x", EMPTY), {**GOOD, "model": "deepseek-reasoner"}
    )
    lint(capsys, path)
    assert no_network == []


@pytest.mark.slow  # the CLI as two processes
def test_exit_codes_as_a_process(tmp_path: Path) -> None:
    good = jsonl(tmp_path / "good.jsonl", GOOD)
    bad = jsonl(tmp_path / "bad.jsonl", HOT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATGATE_")}
    run = [sys.executable, "-m", "chatgate", "lint"]
    ok = subprocess.run([*run, str(good)], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=30)
    ko = subprocess.run([*run, str(bad)], capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=30)
    assert (ok.returncode, ko.returncode) == (0, 1), (ok.stderr, ko.stderr)
    assert f"{bad}:1: temperature: out_of_range [R25]" in ko.stdout


def test_warnings_are_printed_and_do_not_fail_the_lint(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """R32: strict tools off /beta are valid (DeepSeek accepts them there) and shown as a warning."""
    tool = {"type": "function", "function": {"name": "lookup", "strict": True,
                                             "parameters": {"type": "object", "properties": {},
                                                            "additionalProperties": False}}}
    body = {"model": "deepseek-flash", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    path = tmp_path / "agents.json"
    path.write_text(json.dumps(body))
    assert run_lint([str(path)], Policy()) == 0
    out = capsys.readouterr().out
    assert "warning: tools[0].function.strict: strict_not_enforced [R32]" in out
    assert "1 checked, 0 invalid" in out
    assert run_lint([str(path)], Policy(), beta=True) == 0
    assert "warning" not in capsys.readouterr().out


# --- --fix ----------------------------------------------------------------------------------------------

DEVELOPER = {**GOOD, "messages": [{"role": "developer", "content": "You write release notes."},
                                  *GOOD["messages"][1:]]}
CONFLICT = {**GOOD, "model": "deepseek-flash", "thinking": {"type": "disabled"}, "reasoning_effort": "high"}


def fix_config(tmp_path: Path, *names: str) -> Path:
    config = tmp_path / "repair.toml"
    config.write_text("[repair]\n" + "".join(f"{name} = true\n" for name in names))
    return config


def test_fix_writes_the_repaired_jsonl_to_stdout_and_the_repairs_to_stderr(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = jsonl(tmp_path / "requests.jsonl", GOOD, DEVELOPER, CONFLICT)
    code = main(["lint", "--fix", "--config", str(fix_config(tmp_path, "developer_role")), str(path)])
    out, err = capfd.readouterr()
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 3
    assert lines[0] == json.dumps(GOOD), "a valid body is written as it was"
    assert json.loads(lines[1])["messages"][0] == {"role": "system", "content": "You write release notes."}
    assert "reasoning_effort" not in json.loads(lines[2]), "thinking_conflict is on by default"
    assert f"{path}:2: repaired: developer_role@messages[0]" in err
    assert f"{path}:3: repaired: thinking_conflict@reasoning_effort (dropped 'high')" in err
    assert err.splitlines()[-1] == "3 checked, 2 repaired, 0 invalid after repair"


def test_fix_keeps_the_batch_line_around_the_body_and_writes_to_output(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    path = jsonl(tmp_path / "batch.jsonl", batch_line("a", DEVELOPER), batch_line("b", GOOD))
    target = tmp_path / "fixed.jsonl"
    code = main(["lint", "--fix", "--output", str(target), "--config",
                 str(fix_config(tmp_path, "developer_role")), str(path)])
    out, _ = capfd.readouterr()
    assert code == 0 and "repaired: developer_role@messages[0]" in out
    first, second = (json.loads(line) for line in target.read_text().splitlines())
    assert first["custom_id"] == "a" and first["url"] == "/v1/chat/completions"
    assert first["body"]["messages"][0]["role"] == "system"
    assert second == batch_line("b", GOOD)


def test_fix_exits_1_when_something_is_left_invalid(tmp_path: Path,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    path = jsonl(tmp_path / "requests.jsonl", DEVELOPER, HOT)
    code = main(["lint", "--fix", "--format", "json", str(path)])  # developer_role is off by default
    out, err = capfd.readouterr()
    assert code == 1
    report = json.loads(err)
    assert (report["checked"], report["invalid"], report["repaired"]) == (2, 2, 0)
    assert [json.loads(line) for line in out.splitlines()] == [DEVELOPER, HOT], "unrepaired bodies unchanged"


def test_fix_with_several_files_writes_a_directory(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    one = tmp_path / "one.json"
    one.write_text(json.dumps(CONFLICT, indent=2))
    two = jsonl(tmp_path / "two.jsonl", GOOD)
    target = tmp_path / "fixed"
    assert main(["lint", "--fix", "--output", str(target), str(one), str(two)]) == 0
    capfd.readouterr()
    assert "reasoning_effort" not in json.loads((target / "one.json").read_text())
    assert (target / "two.jsonl").read_text() == json.dumps(GOOD) + "\n"


def test_output_without_fix_is_a_usage_error(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--output", str(tmp_path / "x"), str(jsonl(tmp_path / "a.jsonl", GOOD))]) == 2
    assert "--output needs --fix" in capfd.readouterr().err


# --- the Anthropic Messages format ---------------------------------------------------------------------

READ = {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "t.py"}}
CLAUDE = {"model": "claude-sonnet-4-5", "max_tokens": 32000,
          "system": [{"type": "text", "text": "Be brief."}],
          "messages": [{"role": "user", "content": "Fix the test."},
                       {"role": "assistant", "content": [READ]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                     "content": "assert 1 == 2"}]}],
          "tools": [{"name": "Read", "input_schema": {"type": "object"}}]}


def test_anthropic_bodies_are_checked_by_the_anthropic_rules(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = jsonl(tmp_path / "claude.jsonl", CLAUDE, {**CLAUDE, "thinking": {"type": "disabled"}},
                 {"custom_id": "b1", "params": {**CLAUDE, "max_tokens": 0}})
    code, out = lint(capsys, path)
    assert code == 1
    assert f"{path}:1: messages[1].content: thinking_block_missing [A10]: " in out
    assert f"{path}:2:" not in out, "thinking disabled: no thinking block needed"
    assert f"{path}:3 (custom_id b1): max_tokens: max_tokens_out_of_range [A2]" in out


def test_fix_puts_the_empty_thinking_block_into_anthropic_bodies(tmp_path: Path,
                                                                 capfd: pytest.CaptureFixture[str]) -> None:
    path = jsonl(tmp_path / "claude.jsonl", CLAUDE, {"custom_id": "b1", "params": CLAUDE})
    assert main(["lint", "--fix", str(path)]) == 0
    out, err = capfd.readouterr()
    first, second = (json.loads(line) for line in out.splitlines())
    assert first["messages"][1]["content"][0] == {"type": "thinking", "thinking": ""}
    assert second["custom_id"] == "b1" and second["params"]["messages"][1]["content"][0]["type"] == "thinking"
    assert f"{path}:1: repaired: restore_thinking@messages[1]" in err


FIM = {"model": "deepseek-flash", "prompt": "def fib(a):", "suffix": "    return fib(a-1)", "max_tokens": 128}
CALL = {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"cmd\": \"ls\"}"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "README.md"}
THOUGHT = {"type": "reasoning", "id": "rs_1", "summary": [],
           "content": [{"type": "reasoning_text", "text": "I will list them."}]}
CODEX = {"model": "deepseek-flash", "input": [{"role": "user", "content": "List the files."}, THOUGHT, CALL,
                                              OUTPUT],
         "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]}


def test_fim_and_responses_bodies_are_checked_by_their_own_rules(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    orphan = {**CODEX, "input": [{"role": "user", "content": "hi"}, {**OUTPUT, "call_id": "call_9"}]}
    path = jsonl(tmp_path / "mixed.jsonl", FIM, {**FIM, "max_tokens": 5000}, CODEX, orphan,
                 batch_line("b1", {**FIM, "max_tokens": 0}, url="/beta/completions"),
                 batch_line("b2", orphan, url="/v1/responses"), GOOD)
    code, out = lint(capsys, path)
    assert code == 1
    assert f"{path}:1:" not in out and f"{path}:3:" not in out and f"{path}:7:" not in out
    assert f"{path}:2: warning: max_tokens: max_tokens_out_of_range [F6]: max_tokens 5000 is above" in out
    assert f"{path}:4: input[1].call_id: tool_output_without_call [P9]" in out
    assert f"{path}:5 (custom_id b1): max_tokens: max_tokens_out_of_range [F6]" in out
    assert f"{path}:6 (custom_id b2): input[1].call_id: tool_output_without_call [P9]" in out


def test_fix_moves_a_codex_output_back_after_its_call(tmp_path: Path,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    hook = {"role": "developer", "content": "A hook ran."}
    body = {**CODEX, "input": [{"role": "user", "content": "List the files."}, THOUGHT, CALL, hook, OUTPUT]}
    path = jsonl(tmp_path / "codex.jsonl", body)
    assert main(["lint", "--fix", str(path)]) == 0
    out, err = capfd.readouterr()
    fixed = json.loads(out)
    assert [item.get("type", item.get("role")) for item in fixed["input"]] == [
        "user", "reasoning", "function_call", "function_call_output", "developer"]
    assert f"{path}:1: repaired: responses_output_order@input[" in err
