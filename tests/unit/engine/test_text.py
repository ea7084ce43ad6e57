from __future__ import annotations

from switchyard.backends.embedded.openai_format import TextAssembler


class CharTokenizer:
    """One token per character (ids are code points); enough to test text assembly by hand."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def _feed(text: str, stop=()) -> tuple[list[str], TextAssembler]:
    assembler = TextAssembler(CharTokenizer(), tuple(stop))
    deltas = []
    for ch in text:
        deltas.append(assembler.add(ord(ch)))
        if assembler.is_stopped:
            break
    return deltas, assembler


def test_without_stop_every_character_shows_at_once():
    deltas, _ = _feed("hello")
    assert deltas == list("hello")


def test_a_stop_string_across_tokens_is_cut_and_never_shown():
    deltas, assembler = _feed("say END now", stop=["END"])
    assert "".join(deltas) == "say "
    assert assembler.is_stopped
    assert assembler.flush() == ""


def test_a_possible_stop_prefix_is_held_back_then_released():
    deltas, assembler = _feed("an ENigma", stop=["END"])
    assert "".join(deltas) + assembler.flush() == "an ENigma"
    assert deltas[3:5] == ["", ""]  # "E", "N" held while "END" was still possible
    assert deltas[5] == "ENi"


def test_the_earliest_of_several_stops_wins():
    deltas, _ = _feed("abc. def\n", stop=["\n", "."])
    assert "".join(deltas) == "abc"
