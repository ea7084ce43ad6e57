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
        list[str] | None, typer.Option("--dataset", "-d", help="Repeatable. Default: mmlu and gsm8k.")
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
) -> None:
    """Train on the train split; print held-out APGR / CPT against the baselines; write the artifact."""
    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from switchyard.backends.embedded.models import default_cache_dir
    from switchyard.classifier.embedder import EMBEDDER_CHOICES, embedder_for
    from switchyard.classifier.router import ClassifierRouter
    from switchyard.core.traces import traces_digest
    from switchyard.evals import report
    from switchyard.evals.classifier_train import EmbeddingCache
    from switchyard.evals.classifier_train import train as fit
    from switchyard.evals.datasets import LOADERS, STRONG_MODEL, WEAK_MODEL
    from switchyard.evals.evaluate import Outcomes, evaluate_router, split
    from switchyard.evals.routers import make_router

    console = Console()
    names = dataset or ["mmlu", "gsm8k"]
    unknown = [n for n in names if n not in LOADERS]
    if unknown:
        raise cli_error(f"unknown dataset {unknown[0]!r}; known: {', '.join(LOADERS)}")
    datasets = {name: _sample(LOADERS[name](), limit, seed) for name in names}
    texts = sorted({t.prompt for traces in datasets.values() for t in traces})
    if embedder not in EMBEDDER_CHOICES:
        raise cli_error(f"unknown embedder {embedder!r}; known: {', '.join(EMBEDDER_CHOICES)}")
    embedding_model = EMBEDDER_CHOICES[embedder]
    cache = EmbeddingCache(embedder_for(embedding_model), cache_dir or default_cache_dir().parent / "embeddings")
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
    ) as progress:
        task = progress.add_task(f"embedding prompts ({embedding_model})", total=len(texts))
        matrix = cache.encode(texts, on_batch=lambda n: progress.advance(task, n))
    row_of = {text: i for i, text in enumerate(texts)}

    def encode(batch: list[str]) -> np.ndarray:
        return matrix[[row_of[t] for t in batch]]

    digest = traces_digest([t for traces in datasets.values() for t in traces])
    with console.status("fitting the head (target and regularisation chosen on a validation slice of train)"):
        result = fit(
            datasets, WEAK_MODEL, STRONG_MODEL, encode, seed=seed, data_sha256=digest, embedding_model=embedding_model
        )
    classifier = result.classifier
    console.print(
        "validation APGR (train split only): "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(result.validation_apgr.items(), key=lambda kv: -kv[1]))
    )

    test_metrics = {}
    for name, traces in datasets.items():
        test = Outcomes.of(split(traces, "test"), WEAK_MODEL, STRONG_MODEL)
        train_split = split(traces, "train")
        routers = []
        for baseline in ("random", "length", "category-prior"):
            router = make_router(baseline)
            router.fit(train_split, WEAK_MODEL, STRONG_MODEL)
            routers.append(router)
        prompts = [t.prompt for t in test.traces]

        class _Precomputed(ClassifierRouter):
            def score(self, traces, prompts=prompts):  # the test embeddings are already computed
                return self.classifier.score_embedded(encode(prompts), prompts)

        results = [evaluate_router(r, test) for r in routers] + [
            evaluate_router(_Precomputed(classifier=classifier), test)
        ]
        console.print(report.rich_table(f"held-out {name}", results))
        by_name = {r.name: r for r in results}
        apgr, length = by_name["classifier"].apgr, by_name["length"].apgr
        test_metrics[name] = {
            "apgr": round(apgr, 4),
            "cpt50": round(by_name["classifier"].cpt50, 4),
            "cpt80": round(by_name["classifier"].cpt80, 4),
            "length_apgr": round(length, 4),
        }
        verdict = "meets" if apgr >= 0.65 and apgr >= length + 0.10 else "misses"
        console.print(
            f"{name}: classifier APGR {apgr:.3f} vs length {length:.3f} — {verdict} the target "
            "(≥ 0.65 and ≥ length + 0.10)"
        )
    classifier.metadata["test"] = test_metrics
    classifier.metadata["target_chosen_on"] = "validation slice of the train split"
    classifier.save(out)
    _write_thresholds(out / "thresholds.yaml", classifier, datasets, encode, digest)
    console.print(f"wrote {out}/model.joblib, metadata.json and thresholds.yaml")


QUALITY_TARGETS = {"economy": 0.90, "balanced": 0.95, "max": 0.99}


def _write_thresholds(path: Path, classifier, datasets: dict, encode, digest: str) -> None:
    """Thresholds for the three quality modes, picked on the pooled train split."""
    from switchyard.core.thresholds import write_section
    from switchyard.evals.datasets import STRONG_MODEL, WEAK_MODEL
    from switchyard.evals.evaluate import Outcomes
    from switchyard.evals.thresholds import operating_point, pick_threshold

    def scored(split_name: str):
        traces = [t for ts in datasets.values() for t in ts if t.split == split_name]
        outcomes = Outcomes.of(traces, WEAK_MODEL, STRONG_MODEL)
        prompts = [t.prompt for t in outcomes.traces]
        return outcomes, classifier.score_embedded(encode(prompts), prompts)

    (train, train_scores), (test, test_scores) = scored("train"), scored("test")
    modes = {}
    for mode, fraction in QUALITY_TARGETS.items():
        value = pick_threshold(train, train_scores, quality_fraction=fraction)
        modes[mode] = {
            "threshold": value,
            "target": {"quality_fraction": fraction},
            "train": operating_point(train, train_scores, value),
            "test": operating_point(test, test_scores, value),
        }
    balanced = modes["balanced"]
    write_section(
        path,
        "routing",
        {
            "router": "classifier",
            "threshold": balanced["threshold"],
            "weak_model": WEAK_MODEL,
            "strong_model": STRONG_MODEL,
            "target": balanced["target"],
            "data": {
                "source": "RouteLLM " + " + ".join(sorted(datasets)),
                "sha256": digest,
                "num_train": len(train.traces),
                "num_test": len(test.traces),
            },
            "train": balanced["train"],
            "test": balanced["test"],
            "modes": {mode: modes[mode] for mode in ("economy", "max")},
        },
    )


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
