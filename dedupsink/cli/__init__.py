"""The ``dedupsink`` command: job config files and ``run``, ``inspect``, ``validate``, ``release``.

Modules: ``config`` (config files), ``ddl`` (source schemas), ``job`` (checks without Spark),
``run`` (the streaming query), ``inspect`` (store and ports), ``display`` (text), ``main``
(argument parsing and exit codes), ``errors`` (``ConfigError``).
"""
