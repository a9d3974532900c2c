"""Sample programs that tests/test_typing.py type-checks with mypy --strict: ``good_*``
must pass, ``bad_*`` must fail exactly where their ``# E: <error code>`` markers say."""
