"""Claude Code (`@anthropic-ai/claude-code`, installed by `make claude-code` into .ci/node) run in
print mode against a server on 127.0.0.1, offline: a temporary HOME and config directory, every
switch that stops its other traffic, and an unreachable HTTP proxy for anything that ignores them.

`python -m tests.clients.claude_code` records what it sends to a fake Anthropic server (a text
answer, then a round trip through its `Read` tool) into tests/fixtures/claude_code/, trimmed and
made deterministic: what tests replay where Claude Code cannot run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from tests.components import unavailable
from tests.fakes.server import read_body

ROOT = Path(__file__).resolve().parents[2]
CLAUDE = ROOT / ".ci" / "node" / "node_modules" / ".bin" / "claude"
FIXTURES = ROOT / "tests" / "fixtures" / "claude_code"
RUN_BOUND_S = 300.0  # a hang's bound, never a measure: a print-mode run takes about a second here

# Claude Code's switches that stop everything but the model calls (update checks, telemetry, error
# reports, the connectivity probe `HEAD /api/hello` it sends the base URL otherwise).
OFFLINE_ENV = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_BUG_COMMAND": "1",
    "DISABLE_COST_WARNINGS": "1",
    # anything that still tried to reach the internet would meet a closed port (the discard port)
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "HTTP_PROXY": "http://127.0.0.1:9",
    "NO_PROXY": "127.0.0.1,localhost",
}


def claude_binary() -> Path:
    """The installed Claude Code, else the test skips (fails under CI=true) saying how to install it."""
    if CLAUDE.exists():
        return CLAUDE
    how = (
        "`make claude-code` installs it"
        if shutil.which("npm")
        else "npm is not installed (`make claude-code` needs it)"
    )
    unavailable(f"Claude Code is not installed in {CLAUDE.parent.parent.parent}: {how}")


def version() -> str:
    out = subprocess.run([str(claude_binary()), "--version"], capture_output=True, text=True, timeout=RUN_BOUND_S)
    return out.stdout.split()[0]


@dataclass
class PrintRun:
    """One `claude -p` run: its exit status, its JSON result (`result`, `is_error`, `num_turns`, …)."""

    returncode: int
    result: dict[str, Any]
    stderr: str


def run_print(
    prompt: str,
    *,
    base_url: str,
    api_key: str,
    cwd: Path,
    home: Path,
    headers: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> PrintRun:
    """`claude -p PROMPT --output-format json` in `cwd`, pointed at `base_url`, with nothing of this
    process's environment but PATH (no key or setting of the machine's user leaks in); `headers` go
    with each of its requests (ANTHROPIC_CUSTOM_HEADERS). Its temporary files go under `home`."""
    (home / "tmp").mkdir(exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),  # else it leaves a probe directory in /tmp/claude-UID at each run
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": api_key,
        **OFFLINE_ENV,
    }
    if headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = "\n".join(f"{name}: {value}" for name, value in headers.items())
    command = [str(claude_binary()), "-p", prompt, "--output-format", "json", *args]
    done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=RUN_BOUND_S)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = orjson.loads(lines[-1]) if lines else {}
    assert result, f"claude exited {done.returncode} without a JSON result:\n{done.stdout}\n{done.stderr}"
    return PrintRun(done.returncode, result, done.stderr)


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: dict[str, Any] | None


SYSTEM_TURN_REFUSAL = orjson.dumps(
    {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Invalid value for 'messages[1].role': Input should be 'user' or 'assistant'.",
        },
    }
)


def has_system_turn(body: dict[str, Any] | None) -> bool:
    """Whether a Messages request has a `role: system` message (Claude Code's per-turn context)."""
    return any(message.get("role") == "system" for message in (body or {}).get("messages") or [])


@dataclass
class Recorder:
    """An ASGI app that records every request (path, query, headers, body), then hands it to `app`;
    with `refuses_system_turns`, a request with a `role: system` message is answered 400 instead."""

    app: Any
    requests: list[Recorded] = field(default_factory=list)
    refuses_system_turns: bool = False

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = await read_body(receive)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        body = orjson.loads(raw) if raw else None
        self.requests.append(Recorded(scope["method"], scope["path"], scope["query_string"].decode(), headers, body))
        if self.refuses_system_turns and has_system_turn(body):
            await send(
                {"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": SYSTEM_TURN_REFUSAL})
            return
        given = False

        async def replay():
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


@contextmanager
def workspace() -> Iterator[tuple[Path, Path]]:
    """A temporary working directory and HOME, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="claude-code-") as tmp:
        cwd, home = Path(tmp) / "work", Path(tmp) / "home"
        cwd.mkdir()
        home.mkdir()
        yield cwd, home


# ---------------------------------------------------------------------------------------------
# The recording: `python -m tests.clients.claude_code`
# ---------------------------------------------------------------------------------------------

TEXT_LIMIT = 300  # longer texts (the system prompt, reminders, tools' descriptions) are cut here
KEPT_HEADERS = ("accept", "content-type", "user-agent", "anthropic-beta", "anthropic-version", "x-app")
NOTE_FILE = "notes.txt"
NOTE = "The launch code is 4711.\n"


def _trimmed(value: Any, replacements: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {k: _trimmed(v, replacements) for k, v in value.items()}
    if isinstance(value, list):
        return [_trimmed(v, replacements) for v in value]
    if isinstance(value, str):
        for old, new in replacements.items():
            value = value.replace(old, new)
        return value if len(value) <= TEXT_LIMIT else value[:TEXT_LIMIT] + f"…[{len(value) - TEXT_LIMIT} more]"
    return value


def _recording(recorded: Recorded, replacements: dict[str, str]) -> dict[str, Any]:
    headers = {k: v for k, v in recorded.headers.items() if k in KEPT_HEADERS or k.startswith("x-stainless-")}
    if "x-api-key" in recorded.headers:
        headers["x-api-key"] = "<key>"
    body = _trimmed(recorded.body, replacements)
    if body and "metadata" in body:
        body["metadata"] = {"user_id": "<device, account and session ids as JSON>"}
    return {"method": recorded.method, "path": recorded.path, "query": recorded.query, "headers": headers, "body": body}


def record() -> None:
    from tests.fakes.anthropic_upstream import AnthropicState, FakeAnthropicUpstream
    from tests.fakes.server import serve_in_thread

    FIXTURES.mkdir(parents=True, exist_ok=True)
    state = AnthropicState(num_tool_calls=0)
    recorder = Recorder(FakeAnthropicUpstream(state))
    scenarios: dict[str, list[dict[str, Any]]] = {}
    with serve_in_thread(recorder) as url, workspace() as (cwd, home):
        (cwd / NOTE_FILE).write_text(NOTE)
        replacements = {str(cwd): "/work", str(home): "/home"}
        for name, prompt, tools, refuses_system_turns in (
            ("text", "Say hello.", 0, False),
            ("read_tool", f"What is the launch code in {NOTE_FILE}?", 1, False),
            # what it sends a server that refuses its `role: system` message: the refused request,
            # then the same with that message's text folded into the first user message
            ("system_turn_refused", "Say hello.", 0, True),
        ):
            recorder.refuses_system_turns = refuses_system_turns
            state.num_tool_calls, state.tool_name = tools, "Read"
            state.tool_input = {"file_path": str(cwd / NOTE_FILE)}
            start = len(recorder.requests)
            run = run_print(prompt, base_url=url, api_key="sk-ant-record", cwd=cwd, home=home)
            assert run.returncode == 0 and not run.result.get("is_error"), run
            session = run.result.get("session_id", "")
            scenarios[name] = [_recording(r, {**replacements, session: "<session>"}) for r in recorder.requests[start:]]
    fixture = {
        "claude_code_version": version(),
        "how": "python -m tests.clients.claude_code (print mode against tests/fakes/anthropic_upstream.py); "
        f"texts over {TEXT_LIMIT} characters cut, ids and paths replaced",
        "scenarios": scenarios,
    }
    out = FIXTURES / "print_mode.json"
    out.write_bytes(orjson.dumps(fixture, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"{out}: {', '.join(f'{k}: {len(v)} requests' for k, v in scenarios.items())}")


if __name__ == "__main__":
    record()
