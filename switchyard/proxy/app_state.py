"""What the running app holds for its routes: its services (`switchyard.gateway.services`) and its
batch tier and its shadow sampling."""

from __future__ import annotations

from starlette.requests import Request

from switchyard.batch.tier import BatchTier
from switchyard.gateway.services import Services
from switchyard.learning.shadow import Shadow


def services_of(request: Request) -> Services:
    """The running app's services: the one way a route reaches them."""
    services = request.app.state.services
    assert isinstance(services, Services)
    return services


def batch_of(request: Request) -> BatchTier | None:
    """The running app's batch tier (None: not configured)."""
    batch = request.app.state.batch
    assert batch is None or isinstance(batch, BatchTier)
    return batch


def shadow_of(request: Request) -> Shadow | None:
    """The running app's shadow sampling (None: off)."""
    shadow = request.app.state.shadow
    assert shadow is None or isinstance(shadow, Shadow)
    return shadow
