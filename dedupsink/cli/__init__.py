"""The ``dedupsink`` command: ``run``, ``validate``, ``inspect``, ``release`` and ``repair``.

Modules: ``config`` (config files), ``ddl`` (source schemas, kept in step with Spark's parser by
a differential test), ``job`` (checks without Spark), ``run`` (the query), ``inspect`` (store
and ports), ``display`` (text), ``main`` (argument parsing and exit codes), ``errors``
(``ConfigError``).
"""
