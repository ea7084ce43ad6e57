"""The OpenAPI document (`GET /openapi.json`): what each route reads and answers, errors included.

The routes read their bodies themselves (`switchyard.proxy.body`, for the limits and OpenAI-shaped
errors), so FastAPI cannot see them: a route names its body's wire model with `json_body()`, its
query parameters with `query()`, and its answer with `answers()`. Every operation may answer any
4xx or 5xx with OpenAI's error body (Anthropic's under `/v1/messages`); FastAPI's own 422 (a shape
this server never sends) is replaced by it. Every operation takes a bearer key (a team's key, or for
/admin the admin key), except those marked `NO_KEY`; under `/v1/messages` it may come as `x-api-key`
instead; the report pages also take it as a Basic password (`BEARER_OR_BASIC`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from switchyard.proxy.error_response import is_messages_path

_REF = "#/components/schemas/{model}"
NO_KEY: dict[str, Any] = {"security": []}  # `openapi_extra` for a route served without a key
# `openapi_extra` for a page a browser opens: the key as a bearer token or as a Basic password
BEARER_OR_BASIC: dict[str, Any] = {"security": [{"bearer": []}, {"basic": []}]}

ERROR_SCHEMA: dict[str, Any] = {
    "title": "ErrorResponse",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
_ERROR_RESPONSE = {
    "description": "An error, in OpenAI's shape.",
    "content": {"application/json": {"schema": {"$ref": _REF.format(model="ErrorResponse")}}},
}
# Anthropic's Messages API (`/v1/messages` and below) answers its errors in Anthropic's shape.
ANTHROPIC_ERROR_SCHEMA: dict[str, Any] = {
    "title": "AnthropicErrorResponse",
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}
_ANTHROPIC_ERROR_RESPONSE = {
    "description": "An error, in Anthropic's shape.",
    "content": {"application/json": {"schema": {"$ref": _REF.format(model="AnthropicErrorResponse")}}},
}


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema; the models it uses (`$defs`) move to the document's components."""
    return model.model_json_schema(ref_template=_REF)


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads `model` from a JSON body."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": _schema(model)}}}}


def query(*params: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """`openapi_extra` for a route's optional query parameters, as (name, JSON schema) pairs."""
    return {"parameters": [{"name": name, "in": "query", "schema": schema} for name, schema in params]}


def answers(model: type[BaseModel], *, stream: bool = False) -> dict[int | str, dict[str, Any]]:
    """`responses` for a route that answers `model` as JSON and, with `stream`, as server-sent
    events (its chunks, each a `data:` line)."""
    content: dict[str, Any] = {"application/json": {"schema": _schema(model)}}
    if stream:
        content["text/event-stream"] = {}
    return {200: {"description": "Success.", "content": content}}


def install_openapi(app: FastAPI) -> None:
    """Serve the document described above, built once on first request."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                schemas.pop(name, None)
            schemas["ErrorResponse"] = ERROR_SCHEMA
            schemas["AnthropicErrorResponse"] = ANTHROPIC_ERROR_SCHEMA
            document["components"]["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"},
                "basic": {"type": "http", "scheme": "basic", "description": "any user name, the key as password"},
                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            }
            document["security"] = [{"bearer": []}]
            for path, operations in document.get("paths", {}).items():
                is_anthropic = is_messages_path(path)
                for operation in operations.values():
                    for content in _contents(operation):
                        for media in content.values():
                            schemas.update(media.get("schema", {}).pop("$defs", {}))
                    responses = operation.setdefault("responses", {})
                    responses.pop("422", None)
                    errors = _ANTHROPIC_ERROR_RESPONSE if is_anthropic else _ERROR_RESPONSE
                    responses["4XX"] = responses["5XX"] = errors
                    if is_anthropic:
                        operation["security"] = [{"x-api-key": []}, {"bearer": []}]
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _contents(operation: dict[str, Any]) -> list[dict[str, Any]]:
    bodies = [operation.get("requestBody", {}), *operation.get("responses", {}).values()]
    return [body["content"] for body in bodies if "content" in body]
