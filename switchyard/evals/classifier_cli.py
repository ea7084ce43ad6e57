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
    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from switchyard.backends.embedded.models import default_cache_dir
    from switchyard.classifier.embedder import EMBEDDER_CHOICES, embedder_for
    from switchyard.classifier.router import ClassifierRouter
    from switchyard.core.traces import traces_digest
    from switchyard.evals import report
    from switchyard.evals.classifier_train import EmbeddingCache, train_head
    from switchyard.evals.classifier_train import train as fit
    from switchyard.evals.datasets import assign_splits
    from switchyard.evals.evaluate import Outcomes, evaluate_router, split
    from switchyard.evals.routers import make_router

    console = Console()
    if head != "logreg":
        from switchyard.classifier.heads import make_head

        try:
            make_head(head)
        except ValueError as exc:
            raise cli_error(str(exc)) from exc
    names = dataset or list(DEFAULT_DATASETS)
    loaded, pairs = _load_sources(names, pair or [])
    datasets = {name: _sample(traces, limit, seed) for name, traces in loaded.items()}
    for name, traces in datasets.items():
        if {t.split for t in traces} != {"train", "test"}:
            assign_splits(traces)
            console.print(f"{name}: no train/test split in the file; split 80/20 by prompt hash")
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
        weak, strong = pairs[names[0]]
        if head == "logreg":
            result = fit(
                datasets,
                weak,
                strong,
                encode,
                seed=seed,
                data_sha256=digest,
                embedding_model=embedding_model,
                pairs=pairs,
            )
        else:
            result = train_head(
                datasets, pairs, encode, head, seed=seed, data_sha256=digest, embedding_model=embedding_model
            )
    classifier = result.classifier
    console.print(
        "validation APGR (train split only): "
        + ", ".join(f"{k} {v:.3f}" for k, v in sorted(result.validation_apgr.items(), key=lambda kv: -kv[1]))
    )

    test_metrics = {}
    for name, traces in datasets.items():
        weak, strong = pairs[name]
        test = Outcomes.of(split(traces, "test"), weak, strong)
        train_split = split(traces, "train")
        routers = []
        for baseline in ("random", "length", "category-prior"):
            router = make_router(baseline)
            router.fit(train_split, weak, strong)
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
        test_metrics[name] = {  # nan (a share never reached) is not JSON: null
            key: None if np.isnan(value) else round(value, 4)
            for key, value in (
                ("apgr", apgr),
                ("cpt50", by_name["classifier"].cpt50),
                ("cpt80", by_name["classifier"].cpt80),
                ("length_apgr", length),
            )
        }
        verdict = "meets" if apgr >= 0.65 and apgr >= length + 0.10 else "misses"
        console.print(
            f"{name}: classifier APGR {apgr:.3f} vs length {length:.3f} — {verdict} the target "
            "(≥ 0.65 and ≥ length + 0.10)"
        )
    classifier.metadata["test"] = test_metrics
    classifier.metadata["target_chosen_on"] = "validation slice of the train split"
    classifier.save(out)
    _write_thresholds(out / "thresholds.yaml", classifier, datasets, encode, digest, pairs)
    console.print(f"wrote {out}/model.joblib, metadata.json and thresholds.yaml")


QUALITY_TARGETS = {"economy": 0.90, "balanced": 0.95, "max": 0.99}
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


def _write_thresholds(
    path: Path, classifier, datasets: dict, encode, digest: str, pairs: dict[str, tuple[str, str]] | None = None
) -> None:
    """Thresholds for the three quality modes, picked on the pooled train split (each dataset's rows
    read with its own weak/strong pair)."""
    from switchyard.core.thresholds import write_section
    from switchyard.evals.classifier_train import pooled_outcomes
    from switchyard.evals.datasets import STRONG_MODEL, WEAK_MODEL
    from switchyard.evals.thresholds import operating_point, pick_threshold

    pair_of = {name: (pairs or {}).get(name, (WEAK_MODEL, STRONG_MODEL)) for name in datasets}

    def scored(split_name: str):
        chosen = {
            name: [t for t in ts if t.split == split_name and all(m in t.models for m in pair_of[name])]
            for name, ts in datasets.items()
        }
        outcomes = pooled_outcomes(chosen, pair_of)
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
            "weak_model": pair_of[next(iter(datasets))][0],
            "strong_model": pair_of[next(iter(datasets))][1],
            "target": balanced["target"],
            "data": {
                "source": " + ".join(sorted(datasets)),
                **({"pairs": {name: list(p) for name, p in pair_of.items()}} if pairs else {}),
                "sha256": digest,
                "num_train": len(train.traces),
                "num_test": len(test.traces),
            },
            "train": balanced["train"],
            "test": balanced["test"],
            "modes": {mode: modes[mode] for mode in ("economy", "max")},
        },
        keep=("by_value",),
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
