"""Claude Code through Switchyard: `claude -p` with ANTHROPIC_BASE_URL at a proxy whose
`model_aliases` send its `claude-*` models to an OpenAI-compatible fake upstream, answered in text
and through a round trip of its `Read` tool; and the requests it sends, as recorded in
tests/fixtures/claude_code/ (tests/clients/claude_code.py), replayed as streams where Claude Code
cannot run.

One proxy for the module (fake upstream, a team's key, a priced model, a ledger).
"""

from __future__ import annotations

import dataclasses
import uuid
from contextlib import ExitStack
from typing import Any

import httpx
import orjson
import pytest

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app
from tests.clients.claude_code import FIXTURES, NOTE, NOTE_FILE, Recorder, claude_binary, run_print, workspace
from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
from tests.fakes.openai_upstream import WORDS, FakeBehaviour, FakeOpenAIUpstream, FakeState
from tests.fakes.server import serve_in_thread
from tests.helpers import read_ledger, wait_until

KEY = "sk-code-team"
UPSTREAM_MODEL = "coder-fake"
ANSWER = "".join(w + " " for w in WORDS[:5])  # the fake's five tokens
ALIASES = {"claude-*haiku*": {"model": "auto", "quality": "economy"}, "claude-*": "coder"}
TEXT = FakeBehaviour(num_tool_calls=0)  # the fake calls a request's tools unless told not to
RECORDED = orjson.loads((FIXTURES / "print_mode.json").read_bytes())


@dataclasses.dataclass
class Served:
    url: str
    upstream: FakeState
    app: Any


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Any:
    tmp = tmp_path_factory.mktemp("claude-code")
    upstream = FakeState(behaviour=TEXT)
    with ExitStack() as stack:
        upstream_url = stack.enter_context(serve_in_thread(FakeOpenAIUpstream(upstream))) + "/v1"
        settings = Settings(
            models=[
                {
                    "name": "coder",
                    "base_url": upstream_url,
                    "upstream_model": UPSTREAM_MODEL,
                    "tier": "large",
                    "price": {"input_usd_per_mtok": 3.0, "output_usd_per_mtok": 15.0},
                }
            ],
            routing={"auto": {"tiers": ["large"], "warm_up": False, "deadline_ms": 10_000}},
            teams={"code": {"api_keys": [KEY]}},
            model_aliases=ALIASES,
            upstream={"health_timeout_s": 30},
            resilience={"max_attempts": 1},
            billing={"ledger_path": tmp / "usage.db", "spill_path": tmp / "spill.jsonl"},
        )
        app = create_app(settings)
        yield Served(stack.enter_context(serve_in_thread(app)), upstream, app)


@pytest.fixture
def proxy(served: Served) -> Any:
    behaviour = served.upstream.behaviour
    yield served
    served.upstream.behaviour = behaviour


def _metered_once(served: Served, client_request_id: str, num_requests: int) -> list:
    """The ledger's records of the requests sent with `client_request_id`, once `num_requests`
    answered ones are in: exactly one a request the upstream answered, each with real token counts
    and cost; any other is a refusal (a 400 before any call), which costs nothing."""
    records = lambda: read_ledger(served.app, client_request_id=client_request_id)  # noqa: E731
    assert wait_until(lambda: sum(r.status == "completed" for r in records()) >= num_requests), records()
    answered = [r for r in records() if r.status == "completed"]
    assert len(answered) == num_requests and len({r.request_id for r in answered}) == num_requests, records()
    assert all(r.model == "coder" and r.team == "code" for r in answered), answered
    assert all(r.prompt_tokens > 0 and r.completion_tokens > 0 and r.cost_usd > 0 for r in answered), answered
    refused = [r for r in records() if r.status != "completed"]
    assert all(r.status == "refused" and r.completion_tokens == 0 and r.cost_usd == 0 for r in refused), refused
    return records()


# Claude Code 2.1.x sends its per-turn context as a `role: system` message among the messages (its
# beta per-turn-control-2026-07-01). Refused, it would resend the request with that text folded into
# the first user message (recorded in the fixture's `system_turn_refused`), each turn costing a
# refused request first: the proxy takes it as the system message it is.


def test_claude_code_answers_through_an_openai_compatible_model(proxy: Served) -> None:
    claude_binary()
    tag, before_upstream = uuid.uuid4().hex, len(proxy.upstream.records)
    with workspace() as (cwd, home):
        run = run_print(
            "Say hello.", base_url=proxy.url, api_key=KEY, cwd=cwd, home=home, headers={"x-request-id": tag}
        )
    assert run.returncode == 0 and run.result["is_error"] is False, run
    assert run.result["result"].strip() == ANSWER.strip() and run.result["num_turns"] == 1
    sent = proxy.upstream.records[before_upstream:]
    assert [r.path for r in sent] == ["/v1/chat/completions"]
    body = sent[0].body
    assert body["model"] == UPSTREAM_MODEL and body["stream"] is True
    # its system blocks first, the prompt, then its per-turn context as a system message where it stood
    assert [m["role"] for m in body["messages"]] == ["system", "user", "system"]
    assert "Read" in {tool["function"]["name"] for tool in body["tools"]}
    _metered_once(proxy, tag, 1)


def test_claude_code_reads_a_file_through_its_tool(proxy: Served) -> None:
    claude_binary()
    tag, before_upstream = uuid.uuid4().hex, len(proxy.upstream.records)
    with workspace() as (cwd, home):
        (cwd / NOTE_FILE).write_text(NOTE)
        arguments = orjson.dumps({"file_path": str(cwd / NOTE_FILE)}).decode()
        proxy.upstream.behaviour = FakeBehaviour(tool_name="Read", tool_arguments=arguments)
        prompt = f"What is the launch code in {NOTE_FILE}?"
        run = run_print(prompt, base_url=proxy.url, api_key=KEY, cwd=cwd, home=home, headers={"x-request-id": tag})
    assert run.returncode == 0 and run.result["is_error"] is False, run
    assert run.result["result"].strip() == ANSWER.strip() and run.result["num_turns"] == 2
    sent = proxy.upstream.records[before_upstream:]
    assert len(sent) == 2
    first_messages, then = sent[0].body["messages"], sent[1].body["messages"]
    call = next(m for m in then if m.get("tool_calls"))["tool_calls"][0]
    assert call["id"] == "call_fake_0" and call["function"]["name"] == "Read"
    assert orjson.loads(call["function"]["arguments"]) == {"file_path": str(cwd / NOTE_FILE)}
    result = then[-1]
    assert result["role"] == "tool" and result["tool_call_id"] == "call_fake_0"
    assert "4711" in _text_of(result["content"])  # Claude Code read the file and sent it back
    assert len(then) > len(first_messages)
    _metered_once(proxy, tag, 2)


def test_claude_code_is_never_refused(proxy: Served) -> None:
    claude_binary()
    tag = uuid.uuid4().hex
    with workspace() as (cwd, home):
        run = run_print(
            "Say hello.", base_url=proxy.url, api_key=KEY, cwd=cwd, home=home, headers={"x-request-id": tag}
        )
    assert run.returncode == 0 and run.result["is_error"] is False, run
    records = _metered_once(proxy, tag, 1)
    assert [r.status for r in records] == ["completed"], records


def test_claude_code_sends_nothing_but_its_model_calls() -> None:
    """Offline: with the runner's switches it calls only POST /v1/messages (Anthropic's own server
    here, the fake); without them it would first probe `HEAD /api/hello` and look up other hosts."""
    claude_binary()
    state = AnthropicState(num_tool_calls=0)
    recorder = Recorder(FakeAnthropicUpstream(state))
    with serve_in_thread(recorder) as url, workspace() as (cwd, home):
        run = run_print("Say hello.", base_url=url, api_key="sk-ant-fake", cwd=cwd, home=home)
    assert run.returncode == 0 and run.result["result"] == "bonjour from claude ", run
    assert [(r.method, r.path, r.query) for r in recorder.requests] == [("POST", "/v1/messages", "beta=true")]
    assert recorder.requests[0].headers["x-api-key"] == "sk-ant-fake"


def _text_of(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "".join(part.get("text", "") for part in content)


def _events(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    events, name = [], ""
    for line in response.iter_lines():
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = orjson.loads(line.removeprefix("data: "))
            assert data["type"] == name, (name, data)
            events.append((name, data))
    return events


def _replayed(served: Served, recorded: dict[str, Any], tag: str) -> list[tuple[str, dict[str, Any]]]:
    headers = {**recorded["headers"], "x-api-key": KEY, "x-request-id": tag}
    url = f"{served.url}{recorded['path']}?{recorded['query']}"
    with httpx.stream("POST", url, headers=headers, content=orjson.dumps(recorded["body"]), timeout=60) as response:
        if response.status_code != 200:
            response.read()
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["x-switchyard-model"] == "coder"
        return _events(response)


def _check_stream(events: list[tuple[str, dict[str, Any]]], recorded: dict[str, Any]) -> None:
    names = [name for name, _ in events if name != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    assert {"content_block_start", "content_block_delta", "content_block_stop"} <= set(names)
    started = events[0][1]["message"]
    assert started["id"].startswith("msg_") and started["model"] == recorded["body"]["model"]
    text = "".join(d["delta"].get("text", "") for n, d in events if n == "content_block_delta")
    final = next(d for n, d in events if n == "message_delta")
    assert text == ANSWER and final["delta"]["stop_reason"] == "end_turn"
    assert final["usage"]["output_tokens"] == 5 and final["usage"]["input_tokens"] > 0


@pytest.mark.parametrize(
    ("scenario", "index"),
    [
        ("text", 0),
        ("read_tool", 1),
        ("system_turn_refused", 1),  # as Claude Code resends it after the 400
    ],
)
def test_a_recorded_claude_code_request_streams_through_the_proxy(proxy: Served, scenario: str, index: int) -> None:
    recorded = RECORDED["scenarios"][scenario][index]
    body = recorded["body"]
    assert recorded["path"] == "/v1/messages" and body["stream"] is True
    assert "anthropic-beta" in recorded["headers"] and any("cache_control" in block for block in body["system"])
    tag, before_upstream = uuid.uuid4().hex, len(proxy.upstream.records)
    _check_stream(_replayed(proxy, recorded, tag), recorded)
    sent = proxy.upstream.records[before_upstream:]
    assert len(sent) == 1 and sent[0].body["model"] == UPSTREAM_MODEL
    upstream_body = sent[0].body
    assert body.keys() & {"context_management", "output_config"}  # Anthropic's own fields, sent…
    assert not upstream_body.keys() & {"context_management", "output_config"}  # …to no OpenAI-compatible server
    assert [t["function"]["name"] for t in upstream_body["tools"]] == [t["name"] for t in body["tools"]]
    system = upstream_body["messages"][0]
    assert system["role"] == "system" and body["system"][1]["text"] in _text_of(system["content"])
    if scenario == "read_tool":
        assert upstream_body["messages"][-1]["role"] == "tool" and "4711" in _text_of(
            upstream_body["messages"][-1]["content"]
        )
    assert [r.status for r in _metered_once(proxy, tag, 1)] == ["completed"]


def test_the_recording_is_claude_codes_shape() -> None:
    """What the replay stands for: the fixture holds Claude Code's own request, not an edited one."""
    assert RECORDED["claude_code_version"].count(".") == 2
    text, (call, answer) = RECORDED["scenarios"]["text"][0], RECORDED["scenarios"]["read_tool"]
    refused, resent = RECORDED["scenarios"]["system_turn_refused"]
    for recorded in (text, call, answer, refused, resent):
        assert recorded["query"] == "beta=true" and recorded["headers"]["anthropic-version"] == "2023-06-01"
        assert recorded["headers"]["user-agent"].startswith("claude-cli/")
        assert recorded["body"]["model"].startswith("claude-") and recorded["body"]["max_tokens"] > 0
    assert "Read" in {tool["name"] for tool in text["body"]["tools"]}
    assert [block["type"] for block in answer["body"]["messages"][-1]["content"]] == ["tool_result"]
    assert [m["role"] for m in refused["body"]["messages"]] == ["user", "system"]
    assert [m["role"] for m in resent["body"]["messages"]] == ["user"]
