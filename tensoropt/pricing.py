"""Which :class:`~tensoropt.costmodel.CostModel` prices each mesh of a search: the device's
datasheet figures, or a measured profile's (``tensoropt profile``)."""

from __future__ import annotations

import warnings
from typing import Callable

from .cost_terms import CostTerms
from .costmodel import CostModel
from .mesh import Cluster, Mesh
from .training import TrainingConfig

__all__ = ["cost_models", "host_share"]


def cost_models(cluster: Cluster, training: TrainingConfig, profile: str | None = None,
                terms: CostTerms | None = None) -> Callable[[Mesh], CostModel]:
    """mesh -> CostModel. A measured profile replaces the device's peak figures, the compute
    curves and, per mesh, the collectives' α and B (the fit of the mesh's group size where
    all its axes have one measured size, else the joint fit over group sizes). ``terms``:
    fitted terms every node and edge is priced with (``cost_terms``)."""
    terms = terms or CostTerms()
    if profile is None:
        model = CostModel(cluster.device, training=training, terms=terms)
        return lambda mesh: model
    from .profile.data import Profile

    prof = Profile.load(profile)
    measured = prof.machine.catalogue_device
    if measured and measured not in ("cpu", cluster.device.name):
        warnings.warn(f"profile {profile} was measured on {measured}, and the devices are {cluster.device.name}: "
                      "its figures price a device it did not measure", stacklevel=3)
    device = prof.device(cluster.device)
    compute = prof.compute_model()

    def for_mesh(mesh: Mesh) -> CostModel:
        sizes = set(mesh.shape)
        group = sizes.pop() if len(sizes) == 1 else None
        links = {link.name for link in mesh.links}
        if len(links) != 1:
            raise ValueError(f"profile {profile} measured one link; mesh {mesh} spans several "
                             f"({sorted(links)}): profiles are for single-node device sets")
        try:
            collectives = prof.collective_model(mesh.links[0], group_size=group)
        except ValueError:
            collectives = prof.collective_model(mesh.links[0])
        return CostModel(device, compute, collectives, training, terms, host_share=host_share(prof, mesh))

    return for_mesh


def host_share(prof, mesh: Mesh) -> float:
    """Ranks per core where ``mesh``'s ranks, on the CPU host ``prof`` measured (its cores,
    its threads per rank), outnumber its cores; 1 elsewhere (a GPU's ranks each have their
    own device). A pipeline stage's mesh counts its own ranks, not the other stages' that
    share the host with it."""
    m = prof.machine
    if m.device_kind != "cpu" or m.cpu_count < 1:
        return 1.0
    return max(1.0, mesh.size * max(1, m.threads_per_rank) / m.cpu_count)
