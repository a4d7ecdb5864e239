"""openai-node (tests/compat/node, `npm install` there) through a real chatgate, run by this node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pytest

from tests.ci import missing
from tests.compat.conftest import CLIENT_KEY, MODEL, Gate
from tests.harness import REPO_ROOT
from tests.lifeline import die_with_parent

NODE_DIR = REPO_ROOT / "tests" / "compat" / "node"


def need(condition: bool, reason: str) -> None:
    if not condition:
        missing(f"{reason}; scripts/install-test-tools.sh installs it")


@pytest.fixture(scope="module")
def node_run(gate_server: Gate) -> dict[str, Any]:
    """One run of compat.mjs: the three scenarios in order, against a freshly reset fake."""
    node = shutil.which("node")
    need(node is not None, "node is not installed")
    need((NODE_DIR / "node_modules" / "openai" / "package.json").exists(),
         "tests/compat/node/node_modules is missing (npm install)")
    assert node is not None
    gate_server.fake.wait_idle(5)
    gate_server.fake.reset()
    env = {**os.environ, "CHATGATE_BASE_URL": gate_server.base_url, "CHATGATE_CLIENT_KEY": CLIENT_KEY,
           "CHATGATE_MODEL": MODEL}
    proc = subprocess.run([node, "compat.mjs"], cwd=NODE_DIR, env=env, capture_output=True, text=True,
                          timeout=60, preexec_fn=die_with_parent())
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["upstream"] = gate_server.upstream_bodies()
    return result


def test_node_tool_loop_passes_reasoning_content_back_R17(node_run: dict[str, Any]) -> None:
    loop = node_run["tool_loop"]
    assert loop["first_finish_reason"] == "tool_calls" and loop["tool_name"] == "search_forecast"
    assert loop["reasoning_content"]
    assert loop["final_finish_reason"] == "stop"
    assert loop["final_text"].endswith("the tool said forecast for x: light rain")
    second = node_run["upstream"][1]
    assert second["messages"][1]["reasoning_content"] == loop["reasoning_content"]


def test_node_streamed_answer_arrives_in_chunks(node_run: dict[str, Any]) -> None:
    stream = node_run["stream"]
    assert stream["chunks"] > 3
    assert stream["text"] == "Answer 1: the fake DeepSeek says hello."
    assert stream["reasoning"] and stream["completion_tokens"] > 0
    assert node_run["upstream"][2]["stream"] is True


def test_node_broken_history_raises_bad_request_error_R17(node_run: dict[str, Any]) -> None:
    broken = node_run["broken"]
    assert broken["raised"] and broken["is_bad_request"] and broken["class_name"] == "BadRequestError"
    assert broken["status"] == 400 and broken["code"] == "reasoning_content_missing"
    assert broken["rule"] == "R17" and broken["param"] == "messages[1].reasoning_content"
    assert len(node_run["upstream"]) == 3  # the broken request never reached DeepSeek
