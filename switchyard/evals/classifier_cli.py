"""`switchyard classifier …`: train the complexity classifier, score prompts offline."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated

import typer

from switchyard.evals.cli_support import cli_error

app = typer.Typer(no_args_is_help=True, add_completion=False, help="The query-complexity classifier.")


def _sample(traces: list, limit: int | None, seed: int) -> list:
    if limit is None or limit >= len(traces):
        return traces
    return random.Random(seed).sample(traces, limit)


@app.command()
def train(
    dataset: Annotated[
        list[str] | None,
        typer.Option(
            "--dataset",
            "-d",
            help="Repeatable: mmlu, gsm8k, llmrouter, arena, vicuna80, or a trace file (.jsonl[.gz]). "
            "Default: mmlu, gsm8k, llmrouter and arena.",
        ),
    ] = None,
    pair: Annotated[
        list[str] | None,
        typer.Option(
            "--pair",
            help="Repeatable: DATASET=WEAK,STRONG, the weak and strong model whose outcomes label that dataset "
            "(default: the shipped sets' own pairs; a trace file's header, else its two models by cost).",
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="Artifact folder to write.")] = Path("classifier-artifact"),
    limit: Annotated[
        int | None, typer.Option(help="Use at most this many prompts per dataset (seeded sample).")
    ] = None,
    seed: Annotated[int, typer.Option()] = 0,
    cache_dir: Annotated[Path | None, typer.Option(help="Where embeddings are cached between runs.")] = None,
    embedder: Annotated[
        str, typer.Option(help="minilm (the transformer) or static (its token vectors, mean-pooled: ~500x faster).")
    ] = "minilm",
    head: Annotated[
        str,
        typer.Option(
            help="logreg (calibrated, with subject and cluster priors, chosen on validation), or a head of "
            "classifier/heads.py: linear, mlp, knn, mf, gbm, length, or several joined by '+' (the shipped "
            "default: mf+length)."
        ),
    ] = "logreg",
) -> None:
    """Train on the train split; print held-out APGR / CPT against the baselines; write the artifact."""
    from rich.console import Console

    from switchyard.classifier.embedder import EMBEDDER_CHOICES
    from switchyard.core.traces import traces_digest
    from switchyard.evals.classifier_evaluate import held_out_metrics, write_thresholds

    console = Console()
    if head != "logreg":
        _check_head(head)
    names = dataset or list(DEFAULT_DATASETS)
    datasets, pairs = _prepare(console, names, pair or [], limit, seed)
    if embedder not in EMBEDDER_CHOICES:
        raise cli_error(f"unknown embedder {embedder!r}; known: {', '.join(EMBEDDER_CHOICES)}")
    embedding_model = EMBEDDER_CHOICES[embedder]
    encode = _embed(console, datasets, embedding_model, cache_dir)
    digest = traces_digest([t for traces in datasets.values() for t in traces])
    classifier = _fit(console, datasets, pairs, names[0], encode, head, seed, digest, embedding_model)
    classifier.metadata["test"] = held_out_metrics(console, datasets, pairs, classifier, encode)
    classifier.metadata["target_chosen_on"] = "validation slice of the train split"
    classifier.save(out)
    write_thresholds(out / "thresholds.yaml", classifier, datasets, encode, digest, pairs)
    console.print(f"wrote {out}/model.joblib, metadata.json and thresholds.yaml")


def _check_head(head: str) -> None:
    from switchyard.classifier.heads import make_head

    try:
        make_head(head)
    except ValueError as exc:
        raise cli_error(str(exc)) from exc


def _prepare(console, names: list[str], pair_options: list[str], limit: int | None, seed: int):
    """Each dataset's traces (sampled to `limit`, split 80/20 where the file has no split) and pair."""
    from switchyard.evals.datasets import assign_splits

    loaded, pairs = _load_sources(names, pair_options)
    datasets = {name: _sample(traces, limit, seed) for name, traces in loaded.items()}
    for name, traces in datasets.items():
        if {t.split for t in traces} != {"train", "test"}:
            assign_splits(traces)
            console.print(f"{name}: no train/test split in the file; split 80/20 by prompt hash")
    return datasets, pairs


def _embed(console, datasets: dict, embedding_model: str, cache_dir: Path | None):
    """Embed every prompt once (cached on disk, with a progress bar): a function from prompts to
    their embeddings."""
    import numpy as np
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from switchyard.backends.embedded.models import default_cache_dir
    from switchyard.classifier.embedder import embedder_for
    from switchyard.evals.classifier_train import EmbeddingCache

    texts = sorted({t.prompt for traces in datasets.values() for t in traces})
    cache = EmbeddingCache(embedder_for(embedding_model), cache_dir or default_cache_dir().parent / "embeddings")
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
    ) as progress:
        task = progress.add_task(f"embedding prompts ({embedding_model})", total=len(texts))
        matrix = cache.encode(texts, on_batch=lambda n: progress.advance(task, n))
    row_of = {text: i for i, text in enumerate(texts)}

    def encode(batch: list[str]) -> np.ndarray:
        return matrix[[row_of[t] for t in batch]]

    return encode


def _fit(console, datasets: dict, pairs: dict, first: str, encode, head: str, seed: int, digest: str, model: str):
    """The classifier fitted on the train splits (`logreg`: `classifier_train.train`, else the named
    head), its validation APGR printed."""
    from switchyard.evals.classifier_train import train as fit
    from switchyard.evals.classifier_train import train_head

    with console.status("fitting the head (target and regularisation chosen on a validation slice of train)"):
        weak, strong = pairs[first]
        if head == "logreg":
            result = fit(
                datasets, weak, strong, encode, seed=seed, data_sha256=digest, embedding_model=model, pairs=pairs
            )
        else:
            result = train_head(datasets, pairs, encode, head, seed=seed, data_sha256=digest, embedding_model=model)
    console.print(
        "validation APGR (train split only): "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(result.validation_apgr.items(), key=lambda kv: -kv[1]))
    )
    return result.classifier


DEFAULT_DATASETS = ("mmlu", "gsm8k", "llmrouter", "arena")


def _load_sources(names: list[str], pair_options: list[str]) -> tuple[dict, dict[str, tuple[str, str]]]:
    """Each dataset's traces and its (weak, strong) pair: `--pair`, else the shipped set's own, else
    the trace file's header, else its two models by cost."""
    from switchyard.core.traces import TraceFormatError
    from switchyard.evals.datasets import load_dataset
    from switchyard.evals.evaluate import EvalError, resolve_models

    given: dict[str, tuple[str, str]] = {}
    for option in pair_options:
        name, _, models = option.rpartition("=")
        weak, _, strong = models.partition(",")
        if not name or not weak or not strong:
            raise cli_error(f"--pair {option!r}: expected DATASET=WEAK,STRONG")
        if name not in names:
            raise cli_error(f"--pair {option!r}: {name!r} is not one of the --dataset values")
        given[name] = (weak, strong)
    loaded, pairs = {}, {}
    for name in names:
        try:
            traces, meta = load_dataset(name)
            pairs[name] = resolve_models(traces, meta, *given.get(name, (None, None)))
        except (TraceFormatError, EvalError) as exc:
            raise cli_error(f"{exc} (datasets: mmlu, gsm8k, llmrouter, arena, vicuna80, or a trace file)") from exc
        for model in pairs[name]:
            if not any(model in t.models for t in traces):
                raise cli_error(f"{name}: no trace has an outcome for {model!r}")
        loaded[name] = [t for t in traces if all(model in t.models for model in pairs[name])]
    return loaded, pairs


@app.command()
def score(
    source: Annotated[Path, typer.Option("--in", help='JSONL of {"id", "prompt"} lines.')],
    out: Annotated[Path, typer.Option("--out", help='JSONL of {"id", "score"} lines to write.')],
    artifact: Annotated[Path | None, typer.Option(help="Classifier artifact (default: the shipped one).")] = None,
    batch_size: Annotated[int, typer.Option()] = 64,
) -> None:
    """Score prompts offline; a higher score means the prompt needs the stronger model more."""
    import orjson
    from rich.progress import Progress

    from switchyard.classifier.model import DEFAULT_ARTIFACT, ArtifactError, ComplexityClassifier

    try:
        classifier = ComplexityClassifier.load(artifact or DEFAULT_ARTIFACT)
    except ArtifactError as exc:
        raise cli_error(str(exc)) from exc
    rows = []
    try:
        for number, line in enumerate(source.read_bytes().splitlines(), 1):
            if line.strip():
                row = orjson.loads(line)
                if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("prompt"), str):
                    raise cli_error(f'{source}:{number}: each line needs "id" and a string "prompt"')
                rows.append(row)
    except OSError as exc:
        raise cli_error(f"cannot read {source}: {exc.strerror}") from exc
    except orjson.JSONDecodeError as exc:
        raise cli_error(f"{source}: not JSON lines ({exc})") from exc
    with Progress(transient=True) as progress, out.open("wb") as handle:
        task = progress.add_task("scoring", total=len(rows))
        for start in range(0, len(rows), batch_size):
            batch = rows[start : start + batch_size]
            for row, value in zip(batch, classifier.score([r["prompt"] for r in batch]), strict=True):
                handle.write(orjson.dumps({"id": row["id"], "score": round(float(value), 6)}) + b"\n")
            progress.advance(task, len(batch))
    typer.echo(f"scored {len(rows)} prompts into {out}")
