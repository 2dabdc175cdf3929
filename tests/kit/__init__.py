"""The shared test kit: one set of fakes and helpers for every test suite (``tests/`` is on ``sys.path``).

- ``kit.fakes``: ``HashTowers`` (deterministic towers behind the ``DualEncoder`` interface), ``CountingTowers``
  (a spy over any towers), ``FakeRuntime`` (towers + BM25 + an in-process store).
- ``kit.fake_redis``: ``FakeRedis``, a dict-backed stand-in for the redis-py calls the job store makes.
- ``kit.policy``: what every suite agrees on: unmarked tests refused, ``make_settings`` and the ``DPR_*`` /
  ``.env`` scrub every test runs under (``tests/conftest.py``).
"""
