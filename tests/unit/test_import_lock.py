"""The threads that load models import large packages lazily; each holds the one import lock while
it may be the first to import them (core/import_lock.py), so two never import at once."""

from __future__ import annotations

import joblib

from switchyard.classifier.model import DEFAULT_ARTIFACT, ComplexityClassifier
from switchyard.core.import_lock import IMPORT_LOCK


def test_the_classifier_unpickles_its_head_under_the_import_lock(monkeypatch):
    held = []
    load = joblib.load

    def checking_load(*args, **kwargs):
        held.append(IMPORT_LOCK._is_owned())  # type: ignore[attr-defined]
        return load(*args, **kwargs)

    monkeypatch.setattr(joblib, "load", checking_load)
    ComplexityClassifier.load(DEFAULT_ARTIFACT)
    assert held == [True]
    assert not IMPORT_LOCK._is_owned()  # type: ignore[attr-defined]  # and let go of it after
