# -*- test-case-name: tests.test_cluster_settings -*-
"""The mesh in the broker's service: made when C{[cluster] peers} or a
C{peer:} listener asks for it, started and stopped with the broker."""

from __future__ import annotations

from typing import Any

from qmq.cluster.endpoints import check_settings
from qmq.config import ConfigError

__all__ = ["attach_mesh"]


def attach_mesh(service: Any, broker: Any, settings: Any, clock: Any) -> Any:
    """Add the broker's mesh to C{service} if there is anything to link.

    @return: the mesh, or None.
    @raise ConfigError: C{[cluster]} keys that do not go together.
    """
    cluster = settings.section("cluster")
    listeners = [
        spec.partition(":")[2] for spec in settings.listen if spec.partition(":")[0] == "peer"
    ]
    problem = check_settings(cluster, listeners)
    if problem is not None:
        key, text = problem
        raise ConfigError(settings.listen_source if key == "listen" else "", key, text)
    if not cluster.peers and not listeners:
        return None
    from qmq.cluster.mesh import mesh_of  # noqa: PLC0415

    mesh = mesh_of(broker, settings, clock)
    mesh.manage.registry = getattr(service, "connections", None)
    mesh.setServiceParent(service)
    return mesh
