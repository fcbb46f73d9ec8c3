"""The workflow language: parsing and validating a workflow, its steps and schedules,
templates, argument schemas, and the registry of definitions.

``load_file`` and ``parse`` are part of the Python API
(``from orchestration.workflows import load_file``).
"""

from orchestration.workflows.parsing import load_file, parse

__all__ = ["load_file", "parse"]
