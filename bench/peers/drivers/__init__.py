"""Scripts that run inside a peer's own virtualenv, one process per peer for a bench run.

Each is started as ``<venv>/bin/python <script> ...``: its folder is then the first entry of
``sys.path``, so the scripts import :mod:`peer_protocol` beside them and nothing else of the
benchmark (the peer's virtualenv has none of this project's packages).
"""
