"""Each rule of the guard with a pair it must refuse, and the paraphrases it must let through."""

import pytest

from switchyard.cache.guard import DEFAULT_SIMILARITY, DEFAULT_SIMILARITY_BY_EMBEDDER, guard_reason

REFUSED = [
    ("How do I disable two-factor login?", "How do I enable two-factor login?", "negation"),
    ("Why is the sky not blue at noon?", "Why is the sky blue at noon?", "negation"),
    ("Which foods don't contain gluten?", "Which foods contain gluten?", "negation"),
    ("Sort the list in descending order.", "Sort the list in ascending order.", "negation"),
    (
        "Her sister ate 1 less than her and her brother ate 1 more than her.",
        "Her sister ate 1 more than her and her brother ate 1 more than her.",
        "negation",
    ),
    ("What is 17 times 23?", "What is 17 times 24?", "number"),
    ("Give me three ideas for a birthday party.", "Give me five ideas for a birthday party.", "number"),
    ("Convert 1,500 dollars to euros.", "Convert 1,600 dollars to euros.", "number"),
    ('Translate "good morning" into Spanish.', 'Translate "good night" into Spanish.', "quoted string"),
    ("Who sang 'Yesterday' first?", "Who sang 'Let It Be' first?", "quoted string"),
    ("What does `os.path.join` return?", "What does `os.path.split` return?", "quoted string"),
    (
        "Write a docstring for def parse_config(path):",
        "Write a docstring for def load_config(path):",
        "code identifier",
    ),
    ("Why does my_list.sort() return None?", "Why does my_list.reverse() return None?", "code identifier"),
    (
        "What does fetchUserData do when the token expired?",
        "What does fetchUserOrders do when the token expired?",
        "code identifier",
    ),
    ("What is the capital of France?", "What is the capital of Germany?", "entity"),
    ("John has 3 apples and gives one away.", "Mary has 3 apples and gives one away.", "entity"),
    ("Summarise the plot of Hamlet for me.", "Summarise the plot of Macbeth for me.", "entity"),
    ("How far is it from Paris to Rome by train?", "How far is it from Rome to Paris by train?", "word order"),
    (
        "In how many years will Agnes be twice as old as Jane?",
        "In how many years will Jane be twice as old as Agnes?",
        "word order",
    ),
    (
        "Write a function to convert an integer into a roman numeral.",
        "Write a function to convert a roman numeral to an integer.",
        "word order",
    ),
]

PARAPHRASES = [
    ("How can I enable two-factor login?", "How do I enable two-factor login?"),
    ("What's the capital of France?", "What is the capital of France?"),
    ("what is the capital of france", "What is the capital of France?"),
    ("Hi! Please explain how vaccines work.", "Explain how vaccines work."),
    ("Could you describe how vaccines work? Thanks!", "Can you describe how vaccines work?"),
    ("Give me 3 ideas for a birthday party.", "Please give me 3 ideas for a birthday party."),
    ('Translate "good morning" into Spanish, please.', 'Translate "Good morning" into Spanish.'),
    ("Quick question. Why does my_list.sort() return None?", "Why does my_list.sort() return None?"),
    (
        "Write a function to determine the median of two sorted arrays.",
        "Write a function to find the median of two sorted arrays.",
    ),
    ("In how many years will Agnes be twice as old as Jane?", "In how many years will Agnes be twice as old as Jane"),
    ("I'd like to learn Rust. Where should I start?", "I want to learn Rust. Where should I start?"),
]


@pytest.mark.parametrize(("asked", "cached", "reason"), REFUSED)
def test_a_pair_that_needs_another_answer_is_refused_with_its_reason(asked, cached, reason):
    assert guard_reason(asked, cached) == reason
    assert guard_reason(cached, asked) == reason  # the rules look both ways


@pytest.mark.parametrize(("asked", "cached"), PARAPHRASES)
def test_a_paraphrase_is_let_through(asked, cached):
    assert guard_reason(asked, cached) is None
    assert guard_reason(cached, asked) is None


def test_the_same_prompt_always_passes():
    prompt = "Don't enable 2 options in `config.yaml` for Paris."
    assert guard_reason(prompt, prompt) is None


def test_the_default_threshold_is_the_full_minilms():
    assert DEFAULT_SIMILARITY == DEFAULT_SIMILARITY_BY_EMBEDDER["minilm"]
    assert 0 < DEFAULT_SIMILARITY < DEFAULT_SIMILARITY_BY_EMBEDDER["static"] < 1
