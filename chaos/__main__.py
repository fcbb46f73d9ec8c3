"""``python -m chaos``: see :mod:`chaos.cli`."""

from __future__ import annotations

if __name__ == "__main__":
    from chaos.cli import main

    raise SystemExit(main())
