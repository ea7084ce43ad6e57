"""The floor: a bare FastAPI + aiohttp pass-through with no routing, auth, metering or deadlines,
the limit for a Python relay on this stack (the proxy's own upstream client is aiohttp too).

python bench/passthrough.py UPSTREAM_BASE_URL PORT
"""

import sys
from contextlib import asynccontextmanager

import aiohttp
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

UPSTREAM = sys.argv[1].rstrip("/")
PORT = int(sys.argv[2])
JSON = {"content-type": "application/json"}


@asynccontextmanager
async def lifespan(app: FastAPI):
    connector = aiohttp.TCPConnector(limit=1024, limit_per_host=1024)
    app.state.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))
    yield
    await app.state.session.close()


app = FastAPI(lifespan=lifespan)


@app.post("/v1/chat/completions")
async def chat(request: Request):
    body = await request.body()
    session: aiohttp.ClientSession = request.app.state.session
    upstream = await session.post(UPSTREAM + "/chat/completions", data=body, headers=JSON)
    if b'"stream":true' not in body.replace(b" ", b""):
        content = await upstream.read()
        upstream.release()
        return Response(content, status_code=upstream.status, media_type="application/json")

    async def relay():
        try:
            async for chunk in upstream.content.iter_any():
                yield chunk
        finally:
            upstream.release()

    return StreamingResponse(relay(), status_code=upstream.status, media_type="text/event-stream")


@app.post("/v1/embeddings")
async def embeddings(request: Request):
    session: aiohttp.ClientSession = request.app.state.session
    async with session.post(UPSTREAM + "/embeddings", data=await request.body(), headers=JSON) as upstream:
        content = await upstream.read()
    return Response(content, status_code=upstream.status, media_type="application/json")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning", access_log=False)
