"""A fake vLLM server: the fake OpenAI upstream plus vLLM's Prometheus `/metrics`."""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.fakes.openai_upstream import FakeOpenAIUpstream, FakeState

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


class FakeVLLMUpstream(FakeOpenAIUpstream):
    def __init__(self, state: FakeState | None = None, load: VLLMLoad | None = None) -> None:
        super().__init__(state)
        self.load = load or VLLMLoad()

    async def __call__(self, scope, receive, send) -> None:
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
