"""Rank identity from each launcher's environment (pure logic; no MPI needed)."""

from __future__ import annotations

import pytest

from eroica_launch.rankenv import RankEnvError, identity, is_launched_task, tasks_per_node


def test_hydra() -> None:
    ident = identity({"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"})
    assert (ident.rank, ident.world_size, ident.local_rank, ident.local_world_size, ident.node_rank,
            ident.nnodes) == (5, 8, 1, 4, 1, 2)


def test_slurm_pmi2() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "6", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_STEP_NUM_NODES": "3",
           "PMI_FD": "7"}
    ident = identity(env)
    assert (ident.rank, ident.world_size, ident.local_rank, ident.local_world_size, ident.node_rank,
            ident.nnodes, ident.source) == (5, 6, 1, 2, 2, 3, "slurm")


def test_srun_without_mpi_plugin_is_refused() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "4"}
    with pytest.raises(RankEnvError, match="--mpi=pmi2"):
        identity(env)


def test_openmpi_local_ranks_taken_as_given() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    ident = identity(env)
    assert (ident.local_rank, ident.local_world_size, ident.node_rank) == (0, 2, 1)


def test_singleton_and_task_detection() -> None:
    assert identity({}).world_size == 1
    assert not is_launched_task({"SLURM_JOB_ID": "3"})
    assert is_launched_task({"PMI_RANK": "0"})
    assert tasks_per_node("2(x2),1") == [2, 2, 1]
