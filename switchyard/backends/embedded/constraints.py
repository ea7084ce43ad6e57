"""Constrained decoding: the tokens a request may produce next, so that its answer is valid JSON.

`response_format` json_object / json_schema and forced tool calls (`tool_choice` "required" or a
named function) are decoded under a JSON-schema grammar: lm-format-enforcer's character-level
parser walked along the tokenizer's prefix tree gives, at each step, the tokens that keep the text
a prefix of a valid document (EOS only once it is complete). The sampler masks every other token
before it chooses (`sampler.choose_tokens`); logprobs stay those of the model's own distribution.

The tokenizer's side (every token decoded, a prefix tree) takes a few seconds for a 49k vocabulary;
it is built once per engine, on first use, off the event loop (`JsonGrammar.prepare`).
"""

from __future__ import annotations

import re
import threading
from typing import Any

import torch

# Whitespace a model may put in a row between JSON tokens (so no deep indentation): a small model would
# otherwise fill max_tokens with newlines.
MAX_CONSECUTIVE_WHITESPACES = 2
MAX_CACHED_MASKS = 16  # allowed-token tensors kept per request (up to 8 bytes per vocabulary entry)


class JsonConstraint:
    """One request's grammar state: which tokens may come next, advanced by each chosen token."""

    def __init__(self, enforcer: Any, grammar: JsonGrammar) -> None:
        self._enforcer = enforcer
        self._grammar = grammar
        self._generated: tuple[int, ...] = ()
        self._masks: dict[int, tuple[torch.Tensor, Any]] = {}  # id(token list) -> (its ids, the list)
        self._lexer = _Lexer()

    def allowed_token_ids(self) -> torch.Tensor:
        tokens = self._enforcer.get_allowed_tokens(list(self._generated))
        # The enforcer hands back the same list for a repeated parser state (inside a string, say).
        cached = self._masks.get(id(tokens))
        if cached is None or cached[1] is not tokens:
            cached = (torch.tensor(tokens.allowed_tokens, dtype=torch.long), tokens)
            if len(self._masks) >= MAX_CACHED_MASKS:  # most states are new ones: keep a few
                del self._masks[next(iter(self._masks))]
            self._masks[id(tokens)] = cached
        allowed = cached[0]
        # Holes in lm-format-enforcer 0.11's JSON: an object may close right after a comma
        # ({"a": 1,}), an exponent may follow a decimal point with no digit between (1.e5), a
        # string may take a raw line break or end unclosed.
        if self._lexer.is_in_string:
            # The parser counts whitespace in strings too, but its fast path for free text does not
            # check the count: a space past it would end the string unclosed.
            grammar = self._grammar
            fits = grammar.leading_spaces[allowed] + self._lexer.num_spaces <= MAX_CONSECUTIVE_WHITESPACES
            allowed = allowed[fits & ~grammar.has_line_break[allowed] & ~grammar.has_long_space_run[allowed]]
        elif self._lexer.last == ",":
            allowed = allowed[~self._grammar.closes_object[allowed]]
        elif self._lexer.last == ".":
            allowed = allowed[self._grammar.starts_with_digit[allowed]]
        else:
            allowed = allowed[~self._grammar.comma_closes_object[allowed]]
        if not len(allowed):  # never seen; an empty mask would leave the sampler nothing to choose
            return torch.tensor(sorted(self._grammar.eos_token_ids), dtype=torch.long)
        return allowed

    def advance(self, token_id: int) -> None:
        previous = self._generated
        self._generated = (*previous, token_id)
        self._lexer.feed(self._grammar.token_strs.get(token_id, ""))
        # The enforcer keys its states by the whole sequence; only the last one is needed again.
        self._enforcer.prefix_states = {
            k: v for k, v in self._enforcer.prefix_states.items() if len(k) == len(previous)
        }


class _Lexer:
    """Just enough of JSON's lexing to know the last character outside strings (and being in one)."""

    __slots__ = ("is_in_string", "is_escaped", "last", "num_spaces")

    def __init__(self) -> None:
        self.is_in_string = self.is_escaped = False
        self.last = ""  # the last non-whitespace character outside strings; "" in a string
        self.num_spaces = 0  # whitespace characters at the end, in a row

    def feed(self, text: str) -> None:
        for ch in text:
            self.num_spaces = self.num_spaces + 1 if ch in _WHITESPACE else 0
            if self.is_in_string:
                if self.is_escaped:
                    self.is_escaped = False
                elif ch == "\\":
                    self.is_escaped = True
                elif ch == '"':
                    self.is_in_string = False
            elif ch == '"':
                self.is_in_string, self.last = True, ""
            elif not ch.isspace():
                self.last = ch


class JsonGrammar:
    """The tokenizer's side of JSON-constrained decoding, shared by all the requests of an engine."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._data: Any = None
        self._lock = threading.Lock()
        self.token_strs: dict[int, str] = {}
        eos = tokenizer.eos_token_id
        self.eos_token_ids: set[int] = {eos} if isinstance(eos, int) else set(eos or ())
        self._alphabet = ""
        # by token id: its text starts with "}"; it holds a comma then "}" (outside a string); it
        # starts with a digit; it holds a line break; its whitespace at the start; it holds more
        # whitespace in a row than allowed
        self.closes_object = torch.zeros(0, dtype=torch.bool)
        self.has_line_break = torch.zeros(0, dtype=torch.bool)
        self.leading_spaces = torch.zeros(0, dtype=torch.long)
        self.has_long_space_run = torch.zeros(0, dtype=torch.bool)
        self.comma_closes_object = torch.zeros(0, dtype=torch.bool)
        self.starts_with_digit = torch.zeros(0, dtype=torch.bool)

    @property
    def is_prepared(self) -> bool:
        return self._data is not None

    def prepare(self) -> None:
        """Decode the vocabulary into a prefix tree (blocking, seconds; call it off the event loop)."""
        with self._lock:
            if self._data is None:
                data = _tokenizer_data(self._tokenizer)
                self.token_strs = {token_id: text for token_id, text, _ in data.regular_tokens}
                self._alphabet = "".join(sorted({ch for text in self.token_strs.values() for ch in text}))
                self.closes_object = torch.zeros(data.vocab_size + 1, dtype=torch.bool)
                self.comma_closes_object = torch.zeros(data.vocab_size + 1, dtype=torch.bool)
                self.starts_with_digit = torch.zeros(data.vocab_size + 1, dtype=torch.bool)
                self.has_line_break = torch.zeros(data.vocab_size + 1, dtype=torch.bool)
                self.leading_spaces = torch.zeros(data.vocab_size + 1, dtype=torch.long)
                self.has_long_space_run = torch.zeros(data.vocab_size + 1, dtype=torch.bool)
                for token_id, text in self.token_strs.items():
                    self.closes_object[token_id] = text.lstrip().startswith("}")
                    self.comma_closes_object[token_id] = _COMMA_CLOSE.match(text) is not None
                    self.starts_with_digit[token_id] = text[:1].isdigit()
                    self.has_line_break[token_id] = "\n" in text or "\r" in text
                    self.leading_spaces[token_id] = len(text) - len(text.lstrip(_WHITESPACE))
                    runs = re.findall(f"[{_WHITESPACE}]+", text)
                    self.has_long_space_run[token_id] = max(map(len, runs), default=0) > MAX_CONSECUTIVE_WHITESPACES
                self._data = data

    def constraint(self, schema: dict[str, Any] | None) -> JsonConstraint:
        """A fresh constraint for one answer: any JSON object when `schema` is None."""
        from lmformatenforcer import CharacterLevelParserConfig, JsonSchemaParser, TokenEnforcer

        if self._data is None:
            self.prepare()
        # Every character any token holds: the parser's default alphabet (and the one TokenEnforcer
        # sets, the characters tokens start with) lacks some, and its fast path for free text offers
        # tokens with them anyway; a character outside the alphabet then ended the string unclosed.
        config = CharacterLevelParserConfig(
            alphabet=self._alphabet,
            max_consecutive_whitespaces=MAX_CONSECUTIVE_WHITESPACES,
            force_json_field_order=True,  # required keys first, in order: a small model finishes sooner
        )
        parser = JsonSchemaParser(schema if schema is not None else ANY_OBJECT, config=config)
        enforcer = TokenEnforcer(self._data, parser)
        parser.config = config
        return JsonConstraint(enforcer, self)


ANY_OBJECT: dict[str, Any] = {"type": "object"}
_WHITESPACE = " \t\n\r"  # JSON's, as the parser counts them
_COMMA_CLOSE = re.compile(r'^[^"]*,\s*}')


def _may_appear_in_json(text: str) -> bool:
    """Control characters are invalid in a JSON string, and out of one only whitespace may be there;
    a lone byte of a multi-byte character (decoded as U+FFFD) could leave the answer invalid UTF-8.
    So the grammar never offers such tokens (a character that only byte tokens spell cannot be
    written in JSON mode)."""
    return "\ufffd" not in text and all(ch >= " " or ch in "\n\r" for ch in text)


def _tokenizer_data(tokenizer: Any) -> Any:
    """lm-format-enforcer's view of an HF tokenizer. Its own transformers integration imports a
    module transformers 5 no longer has, so this is that function, on the public tokenizer API."""
    from lmformatenforcer import TokenEnforcerTokenizerData

    special_ids = set(tokenizer.all_special_ids)
    special_ids |= {token_id for token_id, added in tokenizer.added_tokens_decoder.items() if added.special}
    zero = tokenizer.encode("0", add_special_tokens=False)[-1]
    vocab_size = len(tokenizer)
    regular = []
    for token_id in range(vocab_size):
        if token_id in special_ids:
            continue
        # Decoded after a "0" and cut, a token that starts a word keeps its leading space.
        after_zero = tokenizer.decode([zero, token_id])[1:]
        if not _may_appear_in_json(after_zero):
            continue
        alone = tokenizer.decode([token_id])
        regular.append((token_id, after_zero, len(after_zero) > len(alone)))

    def decode(token_ids: list[int]) -> str:
        return tokenizer.decode(token_ids).rstrip("\ufffd")

    return TokenEnforcerTokenizerData(regular, decode, tokenizer.eos_token_id, False, vocab_size)
