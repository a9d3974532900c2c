"""What the Kubernetes converter returns: plain slotted dataclasses, kept out of the
converter's module so that a compiled converter builds the same Python objects."""

from __future__ import annotations

from dataclasses import dataclass

from statedb.rows import slot_constructor
from tables.backends import BackendParams
from tables.frontends import FrontendParams
from tables.services import Service, ServiceName


@dataclass(frozen=True, slots=True)
class ServicePort:
    """One entry of spec.ports."""

    name: str
    port: int
    protocol: str
    node_port: int


#: ``ServicePort(...)`` through its slots (every field, positionally).
new_service_port = slot_constructor(ServicePort, "new_service_port")


@dataclass(frozen=True, slots=True)
class ConvertedService:
    """A Service object as a service row plus its complete frontend set."""

    service: Service
    frontends: tuple[FrontendParams, ...] = ()
    #: Set when the service must not exist on this node (service.cilium.io/node does not
    #: match the node's label): the converter deletes it instead.
    not_exposed: str = ""


#: ``ConvertedService(service, frontends, not_exposed)`` through its slots.
new_converted_service = slot_constructor(ConvertedService, "new_converted_service")


@dataclass(frozen=True, slots=True)
class ConvertedEndpoints:
    """An EndpointSlice as the backends it gives one service."""

    slice_name: str
    service_name: ServiceName
    backends: tuple[BackendParams, ...] = ()


#: ``ConvertedEndpoints(slice_name, service_name, backends)`` through its slots.
new_converted_endpoints = slot_constructor(ConvertedEndpoints, "new_converted_endpoints")


