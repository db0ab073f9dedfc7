"""``projections.collective``: the one-process communicator is the identity, and the root search
over processes (value buckets, the candidates gathered and solved exactly) finds the projection's
root. Several real processes: tests/reparam/test_sharded.py."""

from __future__ import annotations

import pytest
import torch

from projections import project_onto_c, projection_root
from projections.collective import LOCAL, root_over


@pytest.mark.parametrize("gather", [1 << 16, 50])
@pytest.mark.parametrize("seed", range(4))
def test_the_root_over_processes_is_the_projection_root(monkeypatch, gather, seed):
    """One process: the bucket rounds (forced with a small gather size) find the exact root."""
    monkeypatch.setattr("projections.collective._ROOT_GATHER", gather)
    g = torch.Generator().manual_seed(seed)
    n = [0, 1, 3000, 40000][seed]
    tau = torch.randn(n, generator=g) * (seed + 1)
    if seed == 2:
        tau = tau.round()  # ties
    eps = torch.tensor(0.25)
    expected = projection_root(eps, tau) if n else eps
    assert float(root_over(eps, tau, LOCAL)) == pytest.approx(float(expected), rel=1e-6)


def test_project_onto_c_with_the_local_communicator_is_unchanged():
    g = torch.Generator().manual_seed(0)
    eps, tau = torch.tensor(0.2), torch.randn(500, generator=g)
    want = project_onto_c(eps, tau)
    got = project_onto_c(eps, tau, comm=LOCAL)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_root_over_processes_takes_one_problem_or_groups():
    class TwoProcesses:
        world = 2

    with pytest.raises(
        ValueError, match=r"comm: the root over several processes takes eps 0-dim, or \(G,\)"
    ):
        projection_root(torch.ones(3), torch.ones(3, 4), comm=TwoProcesses())
