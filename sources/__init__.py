"""sources: what fills the tables (manifests, Kubernetes, netlink).

The Kubernetes converter may be imported compiled (see `sources.native`).
"""

from sources import native as _native

__path__ = _native.package_path(__path__)
