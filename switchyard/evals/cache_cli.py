"""`switchyard eval cache`: how often the semantic cache answers right and wrong on labelled prompt
pairs, with the guard and by cosine alone; the default similarity threshold it picks; a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from switchyard.evals.cli_support import cli_error


def cache(
    pairs: Annotated[
        Path | None,
        typer.Option(
            help="Pairs file (.jsonl[.gz]: asked, cached, label same|different, kind, part). Default: the shipped set."
        ),
    ] = None,
    similarity: Annotated[
        float | None, typer.Option(help="Report this threshold instead of picking one.", min=0.0, max=1.0)
    ] = None,
    embedder: Annotated[
        str, typer.Option(help="minilm (the full model) or static (mean-pooled token vectors).")
    ] = "minilm",
    out: Annotated[Path, typer.Option(help="Folder for the PNG plot.")] = Path("eval-out"),
    plot: Annotated[bool, typer.Option("--plot/--no-plot", help="Draw hit rate against false-hit rate.")] = True,
    cache_dir: Annotated[
        Path | None, typer.Option(help="Where embeddings are kept between runs (default: beside the models).")
    ] = None,
) -> None:
    """Hit rate on "same" pairs and false-hit rate on "different" pairs, with the guard and by cosine
    alone, by kind; without --similarity, picks the threshold with the highest hit rate whose false
    hits stay within 0.5% (held-out part) and shows cosine alone at the same hit rate."""
    from rich.console import Console

    from switchyard.classifier.embedder import EMBEDDER_CHOICES
    from switchyard.evals import cache_eval, cache_report

    if embedder not in EMBEDDER_CHOICES:
        raise cli_error(f"--embedder must be one of {', '.join(EMBEDDER_CHOICES)}")
    try:
        loaded = cache_eval.load_pairs(pairs or cache_eval.SHIPPED_PAIRS)
    except cache_eval.PairsError as exc:
        raise cli_error(str(exc)) from exc
    console = Console()
    scores = cache_eval.PairScores(
        loaded, _similarities(console, loaded, EMBEDDER_CHOICES[embedder], cache_dir), cache_eval.guard_reasons(loaded)
    )
    name = pairs.name if pairs else "the shipped pairs"
    chosen: cache_eval.OperatingPoint | None
    part: str | None
    if similarity is not None:
        chosen = cache_eval.operating_point(scores, similarity, True, None)
        console.print(cache_report.point_line("cosine + guard", chosen))
        console.print(
            cache_report.point_line("cosine only  ", cache_eval.operating_point(scores, similarity, False, None))
        )
        console.print(
            cache_report.kinds_table(f"{name}, {embedder}, similarity ≥ {similarity:.3f}", scores, similarity, None)
        )
        part = None
    else:
        chosen = cache_eval.pick_threshold(scores)
        part = "held_out"
        _print_pick(console, scores, chosen, name, embedder)
    if plot:
        png = out / f"cache-{embedder}.png"
        cache_report.write_plot(
            png, f"Semantic cache on {name} ({embedder}, {part or 'all'} pairs)", scores, part, chosen
        )
        console.print(f"wrote {png}")


def _similarities(console, pairs, embedding_model: str, cache_dir: Path | None):
    """Each pair's cosine similarity, every prompt embedded once (kept on disk, with a progress bar)."""
    from switchyard.backends.embedded.models import default_cache_dir
    from switchyard.classifier.embedder import embedder_for
    from switchyard.evals.cache_eval import similarities
    from switchyard.evals.classifier_train import EmbeddingCache
    from switchyard.evals.cli_support import progress_bar

    store = EmbeddingCache(embedder_for(embedding_model), cache_dir or default_cache_dir().parent / "embeddings")
    num_texts = len({t for p in pairs for t in (p.asked, p.cached)})
    with progress_bar(console) as progress:
        task = progress.add_task(f"embedding prompts ({embedding_model})", total=num_texts)
        return similarities(pairs, lambda texts: store.encode(texts, on_batch=lambda n: progress.advance(task, n)))


def _print_pick(console, scores, chosen, name: str, embedder: str) -> None:
    from switchyard.evals import cache_eval, cache_report

    limit = f"{cache_eval.MAX_FALSE_HIT_RATE * 100:.1f}%"
    if chosen is None:
        console.print(f"no threshold keeps false hits within {limit} with the guard")
        return
    console.print(f"default similarity ({embedder}): {chosen.threshold:.3f}")
    console.print(cache_report.point_line("  held-out, cosine + guard", chosen))
    if scores.mask(part="tune").any():
        console.print(
            cache_report.point_line(
                "  tuning,   cosine + guard", cache_eval.operating_point(scores, chosen.threshold, True, "tune")
            )
        )
    console.print(
        cache_report.point_line(
            "  held-out, cosine only at the same hit rate",
            cache_eval.cosine_only_at(scores, chosen.hit_rate, "held_out"),
        )
    )
    console.print(
        cache_report.point_line(
            "  held-out, cosine only at the same threshold",
            cache_eval.operating_point(scores, chosen.threshold, False, "held_out"),
        )
    )
    console.print(
        cache_report.kinds_table(
            f"{name}, held-out part, similarity ≥ {chosen.threshold:.3f}", scores, chosen.threshold, "held_out"
        )
    )
