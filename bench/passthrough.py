"""The floor: a bare FastAPI + httpx pass-through with no routing, auth or metering.

python bench/passthrough.py UPSTREAM_BASE_URL PORT
"""

import sys
from contextlib import asynccontextmanager

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

UPSTREAM = sys.argv[1].rstrip("/")
PORT = int(sys.argv[2])


@asynccontextmanager
async def lifespan(app: FastAPI):
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    app.state.client = httpx.AsyncClient(limits=limits, timeout=60)
    yield
    await app.state.client.aclose()


app = FastAPI(lifespan=lifespan)


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.body()
    client: httpx.AsyncClient = request.app.state.client
    upstream = client.build_request(
        "POST", UPSTREAM + "/chat/completions", content=body, headers={"content-type": "application/json"}
    )
    response = await client.send(upstream, stream=True)
    if b'"stream":true' not in body.replace(b" ", b""):
        content = await response.aread()
        await response.aclose()
        return Response(content, status_code=response.status_code, media_type="application/json")

    async def relay():
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()

    return StreamingResponse(relay(), status_code=response.status_code, media_type="text/event-stream")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning", access_log=False)
