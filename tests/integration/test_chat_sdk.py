"""The real `openai` SDK, pointed at the proxy, pointed at a fake upstream."""

from __future__ import annotations

import pytest

from tests.helpers import wait_until


def test_chat_non_stream_round_trips(client, fake_state):
    fake_state.behaviour.num_tokens = 4
    raw = client.chat.completions.with_raw_response.create(
        model="fake-small", messages=[{"role": "user", "content": "hi"}]
    )
    completion = raw.parse()
    assert completion.choices[0].message.content == "alpha bravo charlie delta "
    assert completion.usage.completion_tokens == 4
    assert raw.headers["x-switchyard-model"] == "fake-small"
    assert raw.headers["x-switchyard-backend"] == "openai#0"
    assert raw.headers["x-request-id"]
    sent = fake_state.records[-1]
    assert sent.body["model"] == "fake-small"
    assert sent.headers["authorization"] == "Bearer dummy"
    # asked as a stream (the default), so that the first-token timeout guards it; assembled into the answer above
    assert sent.body["stream"] is True and sent.body["stream_options"] == {"include_usage": True}


def test_unknown_client_fields_reach_the_upstream(client, fake_state):
    client.chat.completions.create(
        model="fake-small",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"repetition_penalty": 1.1, "guided_choice": ["a", "b"]},
    )
    body = fake_state.records[-1].body
    assert body["repetition_penalty"] == 1.1
    assert body["guided_choice"] == ["a", "b"]


def test_logprobs_pass_through(client):
    completion = client.chat.completions.create(
        model="fake-small",
        messages=[{"role": "user", "content": "hi"}],
        logprobs=True,
        top_logprobs=3,
    )
    content = completion.choices[0].logprobs.content
    assert len(content) == 5
    assert content[0].logprob == pytest.approx(-0.1)
    assert [t.logprob for t in content[0].top_logprobs] == sorted(
        (t.logprob for t in content[0].top_logprobs), reverse=True
    )
    assert len(content[0].top_logprobs) == 3


def test_stream_reassembles_exactly_with_usage(client, fake_state):
    fake_state.behaviour.num_tokens = 7
    with client.chat.completions.with_streaming_response.create(
        model="fake-small",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert response.headers["x-switchyard-model"] == "fake-small"
        assert response.headers["x-switchyard-backend"] == "openai#0"
        assert response.headers["x-request-id"]
        chunks = list(response.parse())
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "alpha bravo charlie delta echo foxtrot golf "
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 7
    assert chunks[-1].choices == []
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_stream_without_include_usage_has_no_usage_chunk(client, fake_state):
    chunks = list(
        client.chat.completions.create(model="fake-small", messages=[{"role": "user", "content": "hi"}], stream=True)
    )
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    # The proxy still asked the upstream for usage, for metering.
    assert fake_state.records[-1].body["stream_options"] == {"include_usage": True}


def test_stream_logprobs_pass_through(client):
    chunks = list(
        client.chat.completions.create(
            model="fake-small",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            logprobs=True,
            top_logprobs=2,
        )
    )
    logprobs = [c.choices[0].logprobs.content[0] for c in chunks if c.choices and c.choices[0].logprobs]
    assert [round(t.logprob, 3) for t in logprobs] == [-0.1, -0.2, -0.3, -0.4, -0.5]
    assert all(len(t.top_logprobs) == 2 for t in logprobs)


def test_legacy_completions(client, fake_state):
    fake_state.behaviour.num_tokens = 3
    completion = client.completions.create(model="fake-small", prompt="Once upon", max_tokens=2)
    assert completion.choices[0].text == "alpha bravo "
    assert fake_state.records[-1].path == "/v1/completions"
    streamed = client.completions.create(model="fake-small", prompt="Once upon", stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "alpha bravo charlie "


def test_models_list_shows_tier_context_and_readiness(client, proxy_url):
    cards = {card.id: card for card in client.models.list().data}
    assert set(cards) == {"fake-small", "fake-impatient", "fake-down"}
    extra = cards["fake-small"].model_extra
    assert extra["tier"] == "small"
    assert extra["context_window"] == 2048
    assert extra["ready"] is True
    # The health watcher probes at start; the closed port cannot pass.
    assert wait_until(
        lambda: (
            client.models.list().data
            and not {c.id: c for c in client.models.list().data}["fake-down"].model_extra["ready"]
        ),
        timeout_s=30,
    )


async def test_async_client_concurrent_streams(aclient, fake_state):
    import asyncio

    fake_state.behaviour.token_delay_s = 0.01

    async def one(i: int) -> str:
        stream = await aclient.chat.completions.create(
            model="fake-small", messages=[{"role": "user", "content": f"q{i}"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    texts = await asyncio.gather(*(one(i) for i in range(8)))
    assert texts == ["alpha bravo charlie delta echo "] * 8
    completion = await aclient.chat.completions.create(model="fake-small", messages=[{"role": "user", "content": "hi"}])
    assert completion.choices[0].message.content == "alpha bravo charlie delta echo "
