"""How long one large request body blocks the proxy's event loop.

The proxy runs in this process under uvicorn; a ticker task on the same loop sleeps 1 ms at a time
and records the longest gap it sees while `curl` (another process, so it takes no share of the GIL)
posts each body. The upstream is a closed port: the figure is the proxy's own work on the body
(reading, parsing, validating, limits, routing), not an upstream's.

    .venv/bin/python bench/body_loop_block.py [--repeat 5]

Prints one line per body: the HTTP status and the longest loop block (median and max over the
repeats). Not part of `make bench`; the numbers are quoted where the change that needed them is.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import statistics
import tempfile
import time

import orjson
import uvicorn

from switchyard.core.settings import Settings
from switchyard.proxy.app import create_app


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bodies() -> dict[str, tuple[str, bytes]]:
    """name -> (route, body): refused by a limit, then accepted, then a hostile shape under 4 MiB."""

    def chat(messages: list) -> bytes:
        return orjson.dumps({"model": "m", "messages": messages})

    def completion(prompt: list) -> bytes:
        return orjson.dumps({"model": "m", "prompt": prompt})

    empty_arrays = (
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": ['
        + b",".join([b"[]"] * 1_390_000)
        + b"]}"
    )
    return {
        "small chat (2 messages)": ("chat/completions", chat([{"role": "user", "content": "hi"}] * 2)),
        "100k one-word messages": ("chat/completions", chat([{"role": "user", "content": "word"}] * 100_000)),
        "prompt of 500k token ids": ("completions", completion(list(range(1000, 501_000)))),
        "2,000 one-word messages": ("chat/completions", chat([{"role": "user", "content": "word"}] * 2_000)),
        "1,500 messages of 1.3 KB": (
            "chat/completions",
            chat([{"role": "user", "content": "lorem ipsum " * 110}] * 1_500),
        ),
        "prompt of 200k token ids": ("completions", completion(list(range(1000, 201_000)))),
        "1.39M empty arrays": ("chat/completions", empty_arrays),
    }


async def _ticker(gaps: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        gaps.append(time.perf_counter() - started)


async def _post(url: str, path: str) -> str:
    curl = await asyncio.create_subprocess_exec(
        "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "content-type: application/json",
        "--data-binary", f"@{path}", url,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await curl.communicate()
    return out.decode()


async def main(files: dict[str, tuple[str, str, int]], repeat: int) -> None:
    settings = Settings(
        models=[{"name": "m", "base_url": f"http://127.0.0.1:{_closed_port()}/v1"}],
        server={"max_body_bytes": 8 * 1024 * 1024},
        resilience={"max_attempts": 1},
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(settings), log_level="critical", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn has no event for it
        await asyncio.sleep(0.01)
    for name, (route, path, size) in files.items():
        worst: list[float] = []
        statuses: set[str] = set()
        for _ in range(repeat):
            gaps: list[float] = []
            stop = asyncio.Event()
            ticker = asyncio.create_task(_ticker(gaps, stop))
            statuses.add(await _post(f"http://127.0.0.1:{port}/v1/{route}", path))
            stop.set()
            await ticker
            worst.append(max(gaps) * 1000)
        print(
            f"{name:26} {size / 1e6:5.2f} MB  status {','.join(sorted(statuses))}  "
            f"loop blocked: median {statistics.median(worst):7.1f} ms, max {max(worst):7.1f} ms"
        )
    server.should_exit = True
    await serving
    sock.close()


if __name__ == "__main__":
    logging.disable(logging.WARNING)  # every request fails upstream (a closed port) on purpose
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        files = {}
        for i, (name, (route, body)) in enumerate(_bodies().items()):
            files[name] = (route, os.path.join(folder, f"{i}.json"), len(body))
            with open(files[name][1], "wb") as file:
                file.write(body)
        asyncio.run(main(files, args.repeat))
