"""The JSON grammar on its own: any path through the tokens it allows ends in a valid document."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from switchyard.backends.embedded.constraints import JsonGrammar
from switchyard.backends.embedded.sampler import SamplingParams, choose_tokens

SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "enum": ["cat", "dog"]},
        "legs": {"type": "integer", "enum": [2, 4]},
        "tags": {"type": "array", "maxItems": 2, "items": {"type": "boolean"}},
        "owner": {
            "type": "object",
            "properties": {"vip": {"type": "boolean"}, "note": {"type": "null"}},
            "required": ["vip", "note"],
        },
    },
    "required": ["kind", "legs", "tags", "owner"],
}


@pytest.fixture(scope="module")
def grammar(tiny_model):
    _, tokenizer = tiny_model
    grammar = JsonGrammar(tokenizer)
    grammar.prepare()
    return grammar


def _walk(grammar, tokenizer, schema, seed: int, max_tokens: int = 200) -> tuple[str, bool]:
    """Pick uniformly among the allowed tokens: the least likely model there is."""
    pick = random.Random(seed)
    constraint = grammar.constraint(schema)
    ids = []
    for _ in range(max_tokens):
        token_id = pick.choice(sorted(constraint.allowed_token_ids().tolist()))  # the grammar's order varies
        if token_id == tokenizer.eos_token_id:
            return tokenizer.decode(ids), True
        constraint.advance(token_id)
        ids.append(token_id)
    return tokenizer.decode(ids), False


def test_random_walks_under_a_nested_schema_end_valid(grammar, tiny_model):
    _, tokenizer = tiny_model
    finished = 0
    for seed in range(40):
        text, is_finished = _walk(grammar, tokenizer, SCHEMA, seed)
        if is_finished:
            finished += 1
            jsonschema.validate(json.loads(text), SCHEMA)
    assert finished >= 30


def test_random_walks_for_any_object_end_as_objects(grammar, tiny_model):
    _, tokenizer = tiny_model
    finished = 0
    for seed in range(40):
        text, is_finished = _walk(grammar, tokenizer, None, seed, max_tokens=300)
        if is_finished:
            finished += 1
            # lm-format-enforcer alone let 5 of these end in {"k": v,} (constraints.py guards it)
            assert isinstance(json.loads(text), dict), text
    assert finished >= 10


def test_the_sampler_only_picks_allowed_tokens_and_keeps_the_models_logprobs(grammar, tiny_model):
    _, tokenizer = tiny_model
    logits = torch.randn(1, len(tokenizer))
    constraint = grammar.constraint(SCHEMA)
    allowed = set(constraint.allowed_token_ids().tolist())
    (choice,) = choose_tokens(logits, [SamplingParams(temperature=0.0, top_logprobs=3, constraint=constraint)])
    assert choice.token_id in allowed
    assert choice.token_id == max(allowed, key=lambda t: float(logits[0, t]))
    assert choice.logprob == pytest.approx(float(torch.log_softmax(logits[0], -1)[choice.token_id]))
    assert choice.top[0][0] == int(torch.argmax(logits[0]))  # the unconstrained favourite, as the model saw it
    assert tokenizer.decode([choice.token_id]).strip() in ("", "{")
