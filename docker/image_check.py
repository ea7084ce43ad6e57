"""What `make image-test` checks from outside, once the `cpu` image's entrypoint runs: it becomes
ready, the process that answers runs inside the image as its user, and an `auto` chat answer, a
stream and /metrics come back. The standard library only (it runs on the host's `python3`)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request


def _get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _post(url: str, body: dict, timeout: float = 300.0):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    return urllib.request.urlopen(request, timeout=timeout)


def _fail(message: str, log: str) -> None:
    print(f"image-test: {message}", file=sys.stderr)
    try:
        with open(log) as lines:
            print("image-test: the server's last lines:\n" + "".join(lines.readlines()[-40:]), file=sys.stderr)
    except OSError:
        pass
    sys.exit(1)


def wait_ready(url: str, pid: int, log: str, timeout_s: float) -> None:
    """Until /health/ready says 200 (every model loaded: the first start converts the weights),
    while the process lives."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _fail("the server inside the image exited before it was ready", log)
        try:
            status, _ = _get(url + "/health/ready", timeout=5)
            if status == 200:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1)
    _fail(f"not ready within {timeout_s:.0f} s", log)


def serving_process(root_pid: int) -> tuple[int, int, str]:
    """(pid, uid, root) of the `switchyard serve` process under `root_pid` (buildah run's child)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    todo = [root_pid]
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                words = cmdline.read().split(b"\0")
        except OSError:
            continue
        if pid != root_pid and b"serve" in words and any(w.endswith(b"bin/switchyard") for w in words):
            with open(f"/proc/{pid}/status") as status:
                uid = int(next(line for line in status if line.startswith("Uid:")).split()[1])
            return pid, uid, os.readlink(f"/proc/{pid}/root")
    raise LookupError(f"no `switchyard serve` process under pid {root_pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()

    wait_ready(args.url, args.pid, args.log, args.timeout)
    try:
        pid, uid, root = serving_process(args.pid)
    except LookupError as exc:
        _fail(str(exc), args.log)
    if uid == 0 or root == "/":
        _fail(f"the server (pid {pid}) runs as uid {uid} with root {root}: not inside the image as its user", args.log)
    print(f"image-test: ready; pid {pid}, uid {uid} ({args.user}), root {root} (inside {args.image})", file=sys.stderr)

    ask = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    with _post(args.url + "/v1/chat/completions", {"model": "auto", "messages": ask, "max_tokens": 16}) as response:
        route = response.headers.get("x-switchyard-route", "")
        answer = json.load(response)
    text = answer["choices"][0]["message"]["content"]
    if not text or answer["usage"]["completion_tokens"] < 1:
        _fail(f"the auto answer is empty: {answer}", args.log)
    print(f"image-test: auto answered by {answer['model']} ({route}): {text!r}", file=sys.stderr)

    body = {"model": "auto", "messages": ask, "max_tokens": 16, "stream": True}
    chunks, done = [], False
    with _post(args.url + "/v1/chat/completions", body) as response:
        for raw in response:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c.get("choices"))
    if not done or not streamed:
        _fail(f"the stream did not end with [DONE] after content ({len(chunks)} chunks)", args.log)
    print(f"image-test: streamed {len(chunks)} chunks: {streamed!r}", file=sys.stderr)

    status, metrics = _get(args.url + "/metrics")
    counted = [
        line for line in metrics.splitlines() if line.startswith("switchyard_requests_total") and 'status="200"' in line
    ]
    if status != 200 or not counted:
        _fail(f"/metrics answered {status} without answered requests in switchyard_requests_total", args.log)
    print(f"image-test: /metrics counts the requests: {counted[0]}", file=sys.stderr)


if __name__ == "__main__":
    main()
