from __future__ import annotations

import torch

from switchyard.backends.embedded.sampler import SamplingParams, choose_tokens

LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 0.0, 0.0]])


def test_greedy_takes_the_argmax_with_the_model_logprob():
    first, second = choose_tokens(LOGITS, [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0)])
    expected = torch.log_softmax(LOGITS, dim=-1)
    assert (first.token_id, second.token_id) == (0, 1)
    assert abs(first.logprob - float(expected[0, 0])) < 1e-6
    assert first.top == []


def test_top_logprobs_are_sorted_and_per_row():
    params = [SamplingParams(temperature=0.0, top_logprobs=3), SamplingParams(temperature=0.0)]
    first, second = choose_tokens(LOGITS, params)
    assert [token for token, _ in first.top] == [0, 1, 2]
    values = [lp for _, lp in first.top]
    assert values == sorted(values, reverse=True)
    assert second.top == []


def test_logprobs_ignore_temperature():
    [choice] = choose_tokens(LOGITS[:1], [SamplingParams(temperature=5.0, seed=1)])
    assert abs(choice.logprob - float(torch.log_softmax(LOGITS[0], -1)[choice.token_id])) < 1e-6


def test_a_seed_repeats_and_top_p_narrows():
    wide = torch.zeros(1, 50)

    def draws(seed: int) -> list[int]:
        params = SamplingParams(temperature=1.0, seed=seed)  # one generator, as for one request
        return [choose_tokens(wide, [params])[0].token_id for _ in range(10)]

    assert draws(3) == draws(3)
    assert draws(3) != draws(4)
    params = SamplingParams(temperature=1.0, seed=7)
    many = {choose_tokens(wide, [params])[0].token_id for _ in range(40)}
    assert len(many) > 10
    narrow = SamplingParams(temperature=1.0, top_p=0.01, seed=7)
    assert {choose_tokens(LOGITS[:1], [narrow])[0].token_id for _ in range(20)} == {0}
