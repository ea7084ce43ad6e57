"""`switchyard eval cache`: reading pairs, the rule that picks the threshold, the command on a tiny
set, and (slow) the shipped set's figures at the default threshold the guard module records."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from switchyard.cache.guard import DEFAULT_SIMILARITY_BY_EMBEDDER
from switchyard.cli import app
from switchyard.evals import cache_eval
from switchyard.evals.cache_eval import CachePair, PairScores, PairsError

TINY = [
    ("How can I enable dark mode in Firefox?", "How do I enable dark mode in Firefox?", "same", "rephrase"),
    ("what is the capital of australia", "What is the capital of Australia?", "same", "surface"),
    ("Hi! Explain how a bicycle stays upright.", "Explain how a bicycle stays upright.", "same", "politeness"),
    ("How do I disable dark mode in Firefox?", "How do I enable dark mode in Firefox?", "different", "negation"),
    ("What is 12 times 13?", "What is 12 times 14?", "different", "number"),
    ("What is the capital of Canada?", "What is the capital of Australia?", "different", "entity"),
    ("Why does my_list.pop() raise IndexError?", "Why does my_list.remove() raise IndexError?", "different", "code"),
    ("How do I bake sourdough bread?", "How do I enable dark mode in Firefox?", "different", "neighbour"),
]


def write_pairs(path, rows, part="held_out"):
    path.write_text(
        "".join(
            json.dumps({"asked": a, "cached": c, "label": label, "kind": kind, "part": part}) + "\n"
            for a, c, label, kind in rows
        )
    )
    return path


def scores_of(rows):
    """PairScores from (similarity, label, part, guard reason) rows."""
    pairs = [CachePair(f"a{i}", f"c{i}", label, "k", part) for i, (_, label, part, _) in enumerate(rows)]
    return PairScores(pairs, np.array([r[0] for r in rows]), [r[3] for r in rows])


def test_pairs_are_read_and_a_bad_row_is_named(tmp_path):
    good = write_pairs(tmp_path / "good.jsonl", TINY)
    pairs = cache_eval.load_pairs(good)
    assert len(pairs) == len(TINY) and pairs[3] == CachePair(*TINY[3][:2], "different", "negation", "held_out")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + json.dumps({"asked": "x", "cached": "y", "label": "maybe", "kind": "k"}) + "\n")
    with pytest.raises(PairsError, match=r"bad.jsonl, line 9: label must be one of"):
        cache_eval.load_pairs(bad)
    (tmp_path / "missing.jsonl").write_text(json.dumps({"asked": "x", "label": "same", "kind": "k"}) + "\n")
    with pytest.raises(PairsError, match="line 1: not a pair"):
        cache_eval.load_pairs(tmp_path / "missing.jsonl")


def test_the_pick_is_the_highest_hit_rate_whose_false_hits_stay_within_the_limit():
    rows = [(s, "same", "held_out", None) for s in (0.99, 0.97, 0.93, 0.91)]
    rows += [(0.95, "different", "held_out", None)] * 2  # the guard cannot see these: only the threshold can
    rows += [(0.99, "different", "held_out", "number")] * 3  # the guard refuses these at any threshold
    rows += [(0.50, "different", "held_out", None)] * 195
    scores = scores_of(rows)
    chosen = cache_eval.pick_threshold(scores, max_false_hit_rate=0.005)
    assert chosen is not None and chosen.threshold == pytest.approx(
        0.97
    )  # above the unguardable pairs; on a tie, the higher
    assert chosen.hit_rate == 0.5 and chosen.false_hit_rate == 0.0
    # cosine alone serves the 3 pairs the guard refused as well, and cannot do better at that hit rate
    alone = cache_eval.cosine_only_at(scores, chosen.hit_rate, "held_out")
    assert alone is not None and alone.threshold == pytest.approx(0.97) and alone.false_hit_rate == 3 / 200


def test_no_threshold_qualifies_when_a_tuning_pair_would_be_served_everywhere():
    rows = [(0.99, "same", "held_out", None), (0.50, "different", "held_out", None)]
    rows += [(0.999, "different", "tune", None), (0.99, "same", "tune", None)]
    assert cache_eval.pick_threshold(scores_of(rows)) is None


def test_eval_cache_reports_and_plots_a_pairs_file(tmp_path):
    pairs = write_pairs(tmp_path / "tiny.jsonl", TINY)
    out = tmp_path / "out"
    args = ["eval", "cache", "--pairs", str(pairs), "--embedder", "static", "--out", str(out)]
    picked = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert picked.exit_code == 0, picked.output
    assert "default similarity (static):" in picked.output and "cosine only at the same hit rate" in picked.output
    assert "entity" in picked.output and (out / "cache-static.png").stat().st_size > 0
    fixed = CliRunner().invoke(app, [*args, "--similarity", "0.5", "--no-plot"], env={"COLUMNS": "200"})
    assert fixed.exit_code == 0, fixed.output
    # at 0.5 every different pair here is close enough for cosine; the guard refuses all but the neighbour
    assert "cosine + guard: similarity ≥ 0.500" in fixed.output


def test_eval_cache_names_a_bad_file_and_a_bad_embedder(tmp_path):
    runner = CliRunner()
    missing = runner.invoke(app, ["eval", "cache", "--pairs", str(tmp_path / "none.jsonl")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
    wrong = runner.invoke(app, ["eval", "cache", "--embedder", "bert"])
    assert wrong.exit_code == 2 and "--embedder must be one of minilm, static" in wrong.output


@pytest.mark.slow
@pytest.mark.parametrize("embedder", ["minilm", "static"])
def test_the_shipped_pairs_pick_the_default_and_keep_false_hits_within_half_a_percent(embedder):
    from switchyard.backends.embedded.models import default_cache_dir
    from switchyard.classifier.embedder import EMBEDDER_CHOICES, embedder_for
    from switchyard.evals.classifier_train import EmbeddingCache

    pairs = cache_eval.load_pairs()
    store = EmbeddingCache(embedder_for(EMBEDDER_CHOICES[embedder]), default_cache_dir().parent / "embeddings")
    scores = PairScores(pairs, cache_eval.similarities(pairs, store.encode), cache_eval.guard_reasons(pairs))
    chosen = cache_eval.pick_threshold(scores)
    assert chosen is not None and chosen.threshold == pytest.approx(DEFAULT_SIMILARITY_BY_EMBEDDER[embedder])
    assert chosen.false_hit_rate <= cache_eval.MAX_FALSE_HIT_RATE and chosen.hit_rate > 0.9
    alone = cache_eval.cosine_only_at(scores, chosen.hit_rate, "held_out")
    assert alone is not None and alone.false_hit_rate > 0.5  # what the guard buys
