"""`switchyard eval route --artifacts`: load the artifacts, score each set's held-out prompts with
each of them, print the table (the numbers are `artifact_compare`'s)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from switchyard.evals.cli_support import cli_error, dataset_label, load_set, progress_bar


def compare_artifacts(specs: list[str], datasets: list[str], weak: str | None, strong: str | None) -> None:
    from rich.console import Console

    from switchyard.classifier.model import DEFAULT_ARTIFACT, ArtifactError, ComplexityClassifier
    from switchyard.evals import artifact_compare

    if (weak or strong) and len(datasets) != 1:
        raise cli_error("--weak and --strong name one set's models: give one --dataset with them")
    folders = _artifact_folders(specs)
    labels = [folder.name for folder in folders]
    if len(set(labels)) != len(labels):
        raise cli_error(f"two artifact folders share a name: {', '.join(labels)}")
    try:
        metadatas = [ComplexityClassifier.read_metadata(folder) for folder in folders]
    except ArtifactError as exc:
        raise cli_error(str(exc)) from exc
    reference = DEFAULT_ARTIFACT.name if DEFAULT_ARTIFACT.name in labels else labels[0]
    console = Console()
    with progress_bar(console) as progress:
        loading = progress.add_task("loading artifacts", total=len(folders))
        routers = {}
        for label, folder in zip(labels, folders, strict=True):
            routers[label] = _load_router(folder)
            progress.advance(loading)
        names = artifact_compare.chat_first(datasets or list(artifact_compare.DEFAULT_SETS))
        scoring = progress.add_task("scoring sets", total=len(names))
        results = []
        for name in names:
            results.append(_score_set(name, weak, strong, metadatas, routers, reference))
            progress.advance(scoring)
    _print_results(console, results, reference, DEFAULT_ARTIFACT.name)


def _artifact_folders(specs: list[str]) -> list[Path]:
    """The folders the `--artifacts` values name ('all': every shipped one), each once."""
    from switchyard.classifier.model import ARTIFACTS, DEFAULT_ARTIFACT
    from switchyard.evals import artifact_compare

    folders = [
        folder
        for spec in specs
        for folder in (
            artifact_compare.shipped_artifacts(ARTIFACTS, DEFAULT_ARTIFACT) if spec == "all" else [Path(spec)]
        )
    ]
    return list(dict.fromkeys(folders))


def _load_router(folder: Path):
    from switchyard.classifier.model import ArtifactError
    from switchyard.classifier.router import ClassifierRouter

    try:
        return ClassifierRouter(folder)
    except ArtifactError as exc:
        raise cli_error(str(exc)) from exc


def _score_set(
    name: str, weak: str | None, strong: str | None, metadatas: Sequence[Mapping], routers: Mapping, reference: str
):
    """Every artifact on the prompts of set `name` none of them was fitted on."""
    from switchyard.evals import artifact_compare
    from switchyard.evals.datasets import CHAT_SETS
    from switchyard.evals.evaluate import EvalError, Outcomes

    traces, _, set_weak, set_strong = load_set(name, weak, strong)
    label = dataset_label(name)
    kept, which = artifact_compare.held_out(traces, (name, label), metadatas)
    try:
        outcomes = Outcomes.of(kept, set_weak, set_strong)
    except EvalError as exc:
        raise cli_error(f"{name}: {exc}") from exc
    scores = {artifact: r.score(outcomes.traces) for artifact, r in routers.items()}
    return artifact_compare.SetResult(
        dataset=label,
        is_chat=name in CHAT_SETS,
        weak=set_weak,
        strong=set_strong,
        num_prompts=len(outcomes.traces),
        which_prompts=which,
        artifacts=artifact_compare.compare(outcomes, scores, reference),
    )


def _print_results(console, results: list, reference: str, default_label: str) -> None:
    """The table, a line a set, and the artifact best on the chat sets."""
    from switchyard.evals import artifact_compare, report

    console.print(report.artifacts_table(results, reference))
    for line in report.set_lines(results):
        console.print(line, highlight=False)
    best = artifact_compare.best_on_chat(results)
    if best is not None:
        console.print(
            f"best on chat (APGR averaged over {', '.join(r.dataset for r in results if r.is_chat)}): "
            f"{best[0]} ({best[1]:.3f}); the default: {default_label}",
            highlight=False,
        )
