"""What a load balancer sees while `switchyard serve` starts, as the README runs it (no config: the
built-in default, every model on the embedded engine).

Polls /health/live and /health/ready from the moment the process starts; when ready says 200, asks
every chat model of the default config (and `auto`) one question at once, as the first traffic a
balancer would send. Reports when live and ready answered 200, what ready said it was waiting for
meanwhile, and the status of each first answer: every one should be a 200.

    .venv/bin/python bench/readiness.py --no-write
    .venv/bin/python bench/readiness.py --tree /tmp/release   # a `git archive` of another commit
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from overhead import AUTH, free_port, start  # bench/ is on sys.path when run as a script
from results import RESULTS, write_section

ROOT = Path(__file__).resolve().parent.parent
CHAT_MODELS = ("local-small", "local-large", "auto")


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
            return response.status, await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return 0, {}


async def _ask(session: aiohttp.ClientSession, base: str, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    async with session.post(base + "/v1/chat/completions", json=body, headers=AUTH) as response:
        await response.read()
        return str(response.status)


async def measure(tree: Path, timeout_s: float) -> dict:
    logs = Path(tempfile.mkdtemp(prefix="switchyard-readiness-"))
    port = free_port()
    program = [sys.executable, "-m", "switchyard", "serve", "--port", str(port)]
    started = time.monotonic()
    # the user's home: the converted weights in ~/.cache/switchyard are reused, as on a second start
    server = start("switchyard", program, port, logs, env={"PYTHONPATH": str(tree)}, cwd=tree)
    base = f"http://127.0.0.1:{port}"
    result: dict = {"live_s": None, "ready_s": None, "waiting_for": [], "first_answers": {}}
    try:
        async with aiohttp.ClientSession() as session:
            while time.monotonic() - started < timeout_s:
                if server.process is not None and server.process.poll() is not None:
                    raise RuntimeError(f"switchyard serve exited; see {logs}/switchyard.log")
                now = time.monotonic() - started
                if result["live_s"] is None and (await _get(session, base + "/health/live"))[0] == 200:
                    result["live_s"] = now
                status, body = await _get(session, base + "/health/ready")
                if status == 200:
                    result["ready_s"] = now
                    answers = await asyncio.gather(*(_ask(session, base, model) for model in CHAT_MODELS))
                    result["first_answers"] = dict(zip(CHAT_MODELS, answers, strict=True))
                    break
                waiting = body.get("not_ready") or [name for name, ok in body.get("models", {}).items() if not ok]
                if waiting and waiting not in result["waiting_for"]:
                    result["waiting_for"].append(waiting)
                await asyncio.sleep(0.1)
    finally:
        server.stop()
    return result


def section(result: dict, tree: Path) -> str:
    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:.1f} s"

    answers = ", ".join(f"`{model}` {status}" for model, status in result["first_answers"].items()) or "-"
    waited = "; ".join(", ".join(names) for names in result["waiting_for"]) or "-"
    return (
        "## Readiness of `switchyard serve` (`bench/readiness.py`)\n\n"
        f"Run {time.strftime('%Y-%m-%d')} on {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, code at `{tree.name}`: `switchyard serve` with no config (the "
        "built-in default), the converted weights already cached. The first answers are asked the moment "
        "`/health/ready` first says 200.\n\n"
        "| live | ready | ready waited for | first answers |\n| ---: | ---: | --- | --- |\n"
        f"| {seconds(result['live_s'])} | {seconds(result['ready_s'])} | {waited} | {answers} |\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="the checkout to run (default: this one)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="longest wait for ready")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args()
    result = asyncio.run(measure(args.tree.resolve(), args.timeout_s))
    text = section(result, args.tree.resolve())
    print(text)
    if not args.no_write:
        write_section("readiness", text)
        print(f"wrote {RESULTS.relative_to(ROOT)}", file=sys.stderr)


if __name__ == "__main__":
    main()
