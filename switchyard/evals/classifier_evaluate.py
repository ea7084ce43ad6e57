"""A freshly trained classifier judged on each dataset's test split against the baselines, and the
thresholds of its quality modes (`switchyard classifier train`)."""

from __future__ import annotations

from pathlib import Path

QUALITY_TARGETS = {"economy": 0.90, "balanced": 0.95, "max": 0.99}
BASELINES = ("random", "length", "category-prior")


def held_out_metrics(console, datasets: dict, pairs: dict[str, tuple[str, str]], classifier, encode) -> dict:
    """Print each dataset's held-out table (the baselines fitted on its train split, then the
    classifier) and whether the classifier meets the target; its metrics, by dataset, for the metadata."""
    import numpy as np

    from switchyard.evals import report

    test_metrics = {}
    for name, traces in datasets.items():
        results = _held_out_results(traces, pairs[name], classifier, encode)
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
    return test_metrics


def _held_out_results(traces: list, pair: tuple[str, str], classifier, encode) -> list:
    """The baselines' and the classifier's results on the test split, the classifier scoring the
    embeddings already computed."""
    from switchyard.classifier.router import ClassifierRouter
    from switchyard.evals.evaluate import Outcomes, evaluate_router, split
    from switchyard.evals.routers import make_router

    weak, strong = pair
    test = Outcomes.of(split(traces, "test"), weak, strong)
    train_split = split(traces, "train")
    routers = []
    for baseline in BASELINES:
        router = make_router(baseline)
        router.fit(train_split, weak, strong)
        routers.append(router)
    prompts = [t.prompt for t in test.traces]

    class _Precomputed(ClassifierRouter):
        def score(self, traces, prompts=prompts):  # the test embeddings are already computed
            return self.classifier.score_embedded(encode(prompts), prompts)

    return [evaluate_router(r, test) for r in routers] + [evaluate_router(_Precomputed(classifier=classifier), test)]


def write_thresholds(
    path: Path, classifier, datasets: dict, encode, digest: str, pairs: dict[str, tuple[str, str]] | None = None
) -> None:
    """Thresholds for the three quality modes, picked on the pooled train split (each dataset's rows
    read with its own weak/strong pair)."""
    import numpy as np

    from switchyard.core.thresholds import write_section
    from switchyard.evals.classifier_train import pooled_outcomes, with_pairs
    from switchyard.evals.datasets import STRONG_MODEL, WEAK_MODEL
    from switchyard.evals.drift_reference import strong_share_reference
    from switchyard.evals.thresholds import operating_point, pick_threshold

    pair_of = {name: (pairs or {}).get(name, (WEAK_MODEL, STRONG_MODEL)) for name in datasets}

    def scored(split_name: str):
        outcomes = pooled_outcomes(with_pairs(datasets, pair_of, split_name), pair_of)
        prompts = [t.prompt for t in outcomes.traces]
        return outcomes, classifier.score_embedded(encode(prompts), prompts)

    (train, train_scores), (test, test_scores) = scored("train"), scored("test")
    modes, picked = {}, {}
    for mode, fraction in QUALITY_TARGETS.items():
        value = picked[mode] = pick_threshold(train, train_scores, quality_fraction=fraction)
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
            "reference": strong_share_reference(np.concatenate([train_scores, test_scores]), picked["balanced"]),
        },
        keep=("by_value",),
    )
