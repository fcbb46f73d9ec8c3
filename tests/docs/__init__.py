"""The docs as tests: every fenced block of README.md and docs/*.md marked runnable is run.

The convention, the session and the normalisation are described in
:mod:`tests.docs.blocks` and in ``docs/contributing.md``; run the tier with
``.venv/bin/pytest -m docs tests/docs`` (``make docs-test``).
"""
