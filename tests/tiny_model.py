"""A tiny random Llama and a BPE tokenizer trained offline, saved as an HF folder: fast engine tests."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# A template that renders tools, assistant tool calls and tool results (the shape of Hermes-style
# templates, with this tokenizer's special tokens).
TOOLS_CHAT_TEMPLATE = (
    "{% if tools %}<|system|>You may call these tools: {{ tools | tojson }}<|end|>{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' and m.get('tool_calls') %}<|assistant|>"
    "{% for call in m['tool_calls'] %}<tool_call>{{ {'name': call['function']['name'], "
    "'arguments': call['function']['arguments']} | tojson }}</tool_call>{% endfor %}<|end|>"
    "{% elif m['role'] == 'tool' %}<|user|><tool_response id={{ m['tool_call_id'] }}>{{ m['content'] }}"
    "</tool_response><|end|>"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a stitch in time saves nine and the early bird catches the worm",
    "paris is the capital of france and rome is the capital of italy",
    "one two three four five six seven eight nine ten",
] * 20


def build_tiny_model(
    path: Path, chat_template: str = CHAT_TEMPLATE, *, seed: int = 0, corpus: list[str] = CORPUS
) -> Path:
    """The tiny model in `path`; another `seed` gives other weights with the same tokenizer (a draft
    model that disagrees with the first), another `corpus` another vocabulary."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<eos>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<eos>")
    fast.chat_template = chat_template
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path
