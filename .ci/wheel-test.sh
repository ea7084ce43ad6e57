#!/usr/bin/env bash
# `make wheel-test`: the README's pip path, as a new user takes it. Builds the wheel from this
# checkout (its files as they are, committed or not), installs it with all its dependencies into a
# fresh virtualenv as pip resolves them, runs `switchyard models install`, starts `switchyard serve`
# on a free port in an empty home directory and environment, waits for /health/ready, and asks
# local-small a question. Exits 0 only after the answer came; on a failure it shows the server's log.
# Everything lives in one temporary directory, removed at the end (pip's own cache is kept).
#
#   .ci/wheel-test.sh                  # from anywhere; PYTHON=python3.11 by default
#   WHEEL_TEST_READY_S=600 .ci/wheel-test.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
READY_S="${WHEEL_TEST_READY_S:-300}"
work=$(mktemp -d -t switchyard-wheel-test-XXXX)
server_pid=""
started=$(date +%s)

say() { printf 'wheel-test: %s\n' "$*" >&2; }
since() { echo "$(($(date +%s) - $1)) s"; }
cleanup() {
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -INT "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() {
    say "FAILED: $*"
    if [ -f "$work/serve.log" ]; then
        say "the server's log (last 60 lines):"
        tail -n 60 "$work/serve.log" >&2
    fi
    exit 1
}

# -- the wheel, from the checkout's files (tracked and new, not ignored) ----------------------------
t=$(date +%s)
mkdir -p "$work/src" "$work/dist"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -c) | tar -x -C "$work/src"
"$PY" -m venv "$work/venv"
python="$work/venv/bin/python"
pip=("$python" -m pip --disable-pip-version-check)
"${pip[@]}" install --quiet --upgrade pip
"${pip[@]}" wheel --quiet --no-deps -w "$work/dist" "$work/src" || fail "the wheel did not build"
wheel=$(ls "$work/dist"/switchyard_llm-*.whl)
say "built $(basename "$wheel") in $(since "$t")"

# -- pip install switchyard-llm, with every dependency ----------------------------------------------
t=$(date +%s)
"${pip[@]}" install --quiet "$wheel" || fail "pip install of the wheel failed"
say "installed it and its dependencies into a fresh venv in $(since "$t")"

# -- switchyard models install ----------------------------------------------------------------------
t=$(date +%s)
"$work/venv/bin/switchyard" models install --quiet || fail "switchyard models install failed"
say "switchyard models install took $(since "$t")"

# -- switchyard serve: an empty home and environment (no config file, no provider keys) ------------
port=$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$work/home"
t=$(date +%s)
(cd "$work/home" && exec env -i PATH="/usr/bin:/bin" HOME="$work/home" LANG=C.UTF-8 \
    "$work/venv/bin/switchyard" serve --host 127.0.0.1 --port "$port") >"$work/serve.log" 2>&1 &
server_pid=$!
base="http://127.0.0.1:$port"
deadline=$(($(date +%s) + READY_S))
until [ "$(curl -s -o "$work/ready.json" -w '%{http_code}' "$base/health/ready" || true)" = 200 ]; do
    kill -0 "$server_pid" 2>/dev/null || fail "switchyard serve exited before it was ready"
    if [ "$(date +%s)" -ge "$deadline" ]; then
        say "/health/ready said: $(cat "$work/ready.json" 2>/dev/null || echo nothing)"
        fail "not ready after $READY_S s"
    fi
    sleep 1
done
say "ready $(since "$t") after its start"

# -- a chat completion from local-small -------------------------------------------------------------
request='{"model": "local-small", "temperature": 0, "max_tokens": 24,
          "messages": [{"role": "user", "content": "What is the capital of France?"}]}'
curl -sS --fail-with-body --max-time 120 "$base/v1/chat/completions" -H 'content-type: application/json' \
    -d "$request" >"$work/answer.json" || fail "no answer: $(cat "$work/answer.json" 2>/dev/null)"
"$python" - "$work/answer.json" <<'EOF' || fail "not the answer expected"
import json, sys

answer = json.load(open(sys.argv[1]))
content = answer["choices"][0]["message"]["content"]
print(f"wheel-test: {answer['model']} answered {content!r}", file=sys.stderr)
assert answer["model"] == "local-small", answer["model"]
assert "Paris" in content, content
assert answer["usage"]["completion_tokens"] > 0, answer["usage"]
EOF

kill -INT "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=""
# 130: uvicorn shuts down, then re-raises the SIGINT it caught
[ "$status" -eq 0 ] || [ "$status" -eq 130 ] || fail "switchyard serve exited with status $status when stopped"
grep -q "Application shutdown complete" "$work/serve.log" || fail "switchyard serve did not shut down cleanly"
say "passed in $(since "$started")"
