"""A peer's own virtualenv, made on demand: the peers are never this project's dependencies
(celery-director pins another Celery; DBOS and Prefect bring their own SQLAlchemy and web
stacks), so each lives in a folder of its own, named by a ``--*-venv`` option."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def python(venv: Path) -> Path:
    return venv / "bin" / "python"


def has(venv: Path, module: str) -> bool:
    """Whether ``venv``'s python imports ``module``."""
    if not python(venv).exists():
        return False
    probe = subprocess.run(
        [str(python(venv)), "-c", f"import {module}"], capture_output=True, timeout=120
    )
    return probe.returncode == 0


def ensure(venv: Path, requirement: str, module: str) -> str | None:
    """Make ``venv`` hold ``requirement`` (``pip install`` it when ``module`` does not import
    there); ``None``, or the error text the report shows in the peer's row."""
    if has(venv, module):
        return None
    install = [str(python(venv)), "-m", "pip", "install", "-q", requirement]
    steps: list[tuple[str, list[str], float]] = []
    if not python(venv).exists():
        steps.append(("python -m venv", [sys.executable, "-m", "venv", str(venv)], 120))
    steps.append((f"pip install {requirement}", install, 900))
    for what, command, timeout in steps:
        try:
            subprocess.run(command, check=True, timeout=timeout, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            return f"{what} failed: {(exc.stderr or exc.stdout or '').strip()[-2000:]}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{what} failed: {exc}"
    return None


def environment(venv: Path, *, drop_prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment for a program of ``venv``: its ``bin`` first on ``PATH``,
    without this project's virtualenv and ``PYTHONPATH``, and without the variables that
    start with ``drop_prefixes`` (a peer's own settings, which would change what it runs)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(drop_prefixes) and key not in ("VIRTUAL_ENV", "PYTHONPATH")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    return env
