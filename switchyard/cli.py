"""The `switchyard` command."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated

import typer

from switchyard.backends.defaults import describe_default_tiers, load_settings
from switchyard.billing.private_valkey import PrivateValkey, PrivateValkeyError, private_valkey_folder
from switchyard.cli_billing import keys_app, teams_app
from switchyard.cli_models import models_app
from switchyard.cli_report import report
from switchyard.cli_rollout import rollout_app
from switchyard.core.settings import DEFAULT_CONFIG_NAME, ConfigError, workers_refusal
from switchyard.core.urls import redact_credentials
from switchyard.evals.classifier_cli import app as classifier_app
from switchyard.evals.cli import app as eval_app
from switchyard.evals.cli_support import cli_error

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Switchyard: an LLM routing proxy.")
app.add_typer(eval_app, name="eval")
app.add_typer(classifier_app, name="classifier")
app.add_typer(teams_app, name="teams")
app.add_typer(keys_app, name="keys")
app.add_typer(models_app, name="models")
app.add_typer(rollout_app, name="rollout")
app.command("report")(report)
engine_app = typer.Typer(no_args_is_help=True, add_completion=False, help="The embedded CPU engine.")
app.add_typer(engine_app, name="engine")

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help=f"YAML config file. Default: ./{DEFAULT_CONFIG_NAME} if present, else the built-in default.",
        dir_okay=False,
    ),
]


def _resolve_config(config: Path | None) -> Path | None:
    if config is not None:
        return config
    local = Path(DEFAULT_CONFIG_NAME)
    return local if local.is_file() else None


@app.command()
def serve(
    config: ConfigOption = None,
    host: Annotated[str | None, typer.Option(help="Overrides server.host.")] = None,
    port: Annotated[int | None, typer.Option(help="Overrides server.port.")] = None,
    workers: Annotated[
        int | None,
        typer.Option(min=1, help="Worker processes on the one port; overrides server.workers."),
    ] = None,
) -> None:
    """Run the proxy."""
    from switchyard.backends.embedded.threads import choose_wait_policy

    choose_wait_policy()  # before anything imports torch (see threads.py)
    settings = serve_settings(config, workers)
    if host is not None:
        settings.server.host = host
    if port is not None:
        settings.server.port = port
    start_lines = describe_default_tiers(settings) if _resolve_config(config) is None else []
    if settings.server.workers > 1:
        _run_workers(settings, start_lines)
    else:
        _run(settings, start_lines)


def serve_settings(config: Path | None, workers: int | None):
    """The settings `serve` runs with: the file's (or the local default's), the environment over
    them, and `--workers` over both (the file's `server.workers` is not checked when the flag sets it)."""
    try:
        with _workers_in_environment("1" if workers is not None else None):
            settings = load_settings(_resolve_config(config))
    except ConfigError as exc:
        raise cli_error(str(exc)) from exc
    if workers is not None:
        if (refusal := workers_refusal(workers, settings.billing)) is not None:
            raise cli_error(refusal)
        settings.server.workers = workers
    return settings


@contextlib.contextmanager
def _workers_in_environment(value: str | None) -> Iterator[None]:
    """While the settings load: `server.workers` from the environment (which wins over the file) set
    to `value`, in place of any spelling of it there; None leaves the environment alone."""
    if value is None:
        yield
        return
    saved = {name: os.environ.pop(name) for name in [n for n in os.environ if n.upper() == WORKERS_ENV]}
    os.environ[WORKERS_ENV] = value
    try:
        yield
    finally:
        os.environ.pop(WORKERS_ENV, None)
        os.environ.update(saved)


WORKERS_ENV = "SWITCHYARD__SERVER__WORKERS"


def _log_start_lines(lines: Sequence[str]) -> None:
    log = logging.getLogger("uvicorn.error")  # serve's own start lines, beside uvicorn's and at its level
    for line in lines:
        log.info("%s", line)


def _run_workers(settings, start_lines: Sequence[str] = ()) -> None:
    from switchyard.core.thresholds import ThresholdsError
    from switchyard.gateway.services import check_startup
    from switchyard.proxy import workers
    from switchyard.proxy.log_limits import install_repeat_filter

    try:
        check_startup(settings)  # a bad thresholds file stops the start here, not in every worker
    except ThresholdsError as exc:
        raise cli_error(str(exc)) from exc
    logging.basicConfig(level=settings.server.log_level.upper(), format="%(levelname)s:     %(message)s")
    install_repeat_filter()
    _log_start_lines(start_lines)
    num_workers = settings.server.workers
    with contextlib.ExitStack() as stack:
        if (folder := private_valkey_folder(settings.billing, num_workers)) is not None:
            try:  # one for every worker: budgets, rate limits and the batch queue shared as through a URL
                private = stack.enter_context(PrivateValkey.start(folder))
            except PrivateValkeyError as exc:
                message = f"--workers {num_workers} needs Valkey, and the private one did not start: {exc}"
                raise cli_error(message) from exc
            _log_private_valkey(private, None)
            settings.billing.redis_url = private.url
        try:
            exit_code = workers.serve(settings, num_workers)
        except OSError as exc:  # the address is taken, say
            raise cli_error(f"cannot listen on {settings.server.host}:{settings.server.port}: {exc}") from exc
    if exit_code:
        raise typer.Exit(exit_code)


def _log_private_valkey(private: PrivateValkey | None, problem: str | None) -> None:
    log = logging.getLogger("uvicorn.error")  # serve's own start lines, beside uvicorn's and at its level
    if private is not None:
        log.info("private Valkey at %s (data in %s)", private.url, private.folder)
    elif problem is not None:
        log.warning(
            "no private Valkey (%s): the batch API answers 503; set billing.redis_url to a server of your own",
            problem,
        )


def _run(settings, start_lines: Sequence[str] = ()) -> None:
    from switchyard.billing.ledger import adopt_spill_files
    from switchyard.core.thresholds import ThresholdsError
    from switchyard.gateway.request_log import install_request_log_handler
    from switchyard.proxy.app import create_app
    from switchyard.proxy.edge import raise_nofile_limit, uvicorn_config
    from switchyard.proxy.log_limits import install_repeat_filter
    from switchyard.proxy.streams import GracefulServer
    from switchyard.proxy.workers import bind_socket

    try:  # a server running on the port keeps its spill files: only a start that can listen adopts them
        bind_socket(settings.server.host, settings.server.port).close()
    except OSError as exc:
        raise cli_error(f"cannot listen on {settings.server.host}:{settings.server.port}: {exc}") from exc
    with contextlib.ExitStack() as stack:
        private, problem = None, None
        if (folder := private_valkey_folder(settings.billing)) is not None:
            try:  # the batch queue's; budgets and rate limits stay in this process
                private = stack.enter_context(PrivateValkey.start(folder))
            except PrivateValkeyError as exc:  # interactive requests do not need it: serve them
                problem = str(exc)
        try:
            app_ = create_app(
                settings, private_valkey_url=private.url if private is not None else None, reload_signal=True
            )
        except ThresholdsError as exc:
            raise cli_error(str(exc)) from exc
        if settings.billing.resolved_database_url() is not None:  # a server without a ledger leaves them to one with
            spill_path = settings.billing.spill_path.expanduser()
            adopt_spill_files(spill_path, spill_path)  # spill files that workers of an earlier run left
        raise_nofile_limit()
        config = uvicorn_config(app_, settings.server)
        install_repeat_filter()  # after the Config, which sets up uvicorn's loggers
        install_request_log_handler(settings.logging)
        _log_start_lines(start_lines)
        _log_private_valkey(private, problem)
        GracefulServer(config).run()  # the private Valkey stops after the server (SIGTERM, Ctrl-C)


@app.command()
def worker(
    config: ConfigOption = None,
    nice: Annotated[int, typer.Option(min=0, max=19, help="CPU niceness: below the proxies' (0) by default.")] = 10,
) -> None:
    """Run batch lines beside the proxies, without an HTTP server: scales out the batch tier.

    Needs billing.redis_url and the proxies' database (a proxy's private Valkey is its own: a worker
    cannot reach it). SIGTERM stops it once its lines finish (10 s at most).
    """
    import asyncio
    import signal

    from switchyard.batch.runner import run_worker
    from switchyard.core.errors import NotConfigured

    settings = serve_settings(config, None)
    if settings.billing.valkey_url() is None or settings.billing.resolved_database_url() is None:
        raise cli_error(
            "a batch worker needs billing.redis_url (the queue) and a database (billing.database_url); "
            "the private Valkey of a `switchyard serve` is its own, so give both the same billing.redis_url"
        )
    spill = settings.billing.spill_path.expanduser()  # its own, replayed by its next start
    settings.billing.spill_path = spill.with_name(f"{spill.stem}.batch-worker{spill.suffix}")
    os.nice(nice)
    logging.basicConfig(level=settings.server.log_level.upper(), format="%(levelname)s:     %(message)s")

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        try:
            await run_worker(settings)
        except asyncio.CancelledError:
            logging.getLogger("switchyard.batch").info("batch worker stopped")

    try:
        asyncio.run(main())
    except NotConfigured as exc:
        raise cli_error(exc.message) from exc


@engine_app.command("serve")
def engine_serve(
    model: Annotated[str, typer.Option(help="smollm2-135m, an HF model folder, or a .gguf file.")] = "smollm2-135m",
    name: Annotated[str | None, typer.Option(help="Public model name (default: --model).")] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8001,
    num_blocks: Annotated[int, typer.Option(help="KV-cache blocks.")] = 256,
    page_size: Annotated[int, typer.Option(help="Tokens per KV-cache block.")] = 32,
    max_batch_tokens: Annotated[int, typer.Option(help="Tokens per forward pass.")] = 512,
    context_window: Annotated[int, typer.Option(help="Largest prompt + max_tokens.")] = 2048,
    threads: Annotated[int | None, typer.Option(help="Torch threads (default: all cores).")] = None,
) -> None:
    """Serve one model on the embedded engine as an OpenAI-compatible server (like vLLM's)."""
    from switchyard.core.settings import Settings

    engine = {
        "num_blocks": num_blocks,
        "page_size": page_size,
        "max_batch_tokens": max_batch_tokens,
        "context_window": context_window,
        "threads": threads,
    }
    entry = {"name": name or model, "backend": "embedded", "model": model, "engine": engine}
    for variable in [name for name in os.environ if name.upper() == WORKERS_ENV]:
        del os.environ[variable]  # the proxy's (which the environment would impose): the engine is one process
    settings = Settings(server={"host": host, "port": port}, models=[entry])
    # the proxy in front meters the requests: no ledger here, whose default paths (or the environment's
    # database) are the proxy's, so it would meter them twice and take the proxy's spill files
    settings.billing.ledger_path = settings.billing.database_url = None
    _run(settings)


@app.command("check-config")
def check_config(config: ConfigOption = None) -> None:
    """Validate a config file and print what it resolves to (secrets masked)."""
    import yaml

    try:
        settings = load_settings(_resolve_config(config))
    except ConfigError as exc:
        raise cli_error(str(exc)) from exc
    from switchyard.core.urls import mask_password

    dumped = settings.model_dump(mode="json", exclude_none=True)
    if "database_url" in dumped.get("billing", {}):
        dumped["billing"]["database_url"] = mask_password(dumped["billing"]["database_url"])
    if "redis_url" in dumped.get("billing", {}):
        dumped["billing"]["redis_url"] = mask_password(dumped["billing"]["redis_url"])
    typer.echo(redact_credentials(yaml.safe_dump(dumped, sort_keys=False)))


if __name__ == "__main__":
    app()
