"""Secrets bound to hosts, and their redaction from anything a provider sends back.

A workflow names a secret (an http header ``{secret: NAME}``, langgraph's ``api_key_env``);
its value is the worker's environment variable ``NAME``. Workflows are written by tenants,
so a name is usable only when the operator declared it in ``ORCH_PROVIDER_SECRETS`` with the
hosts it may travel to (allow-list entries, see :mod:`orchestration.core.egress`): otherwise a
workflow could send ``AWS_SECRET_ACCESS_KEY`` to a server of its own. ``ORCH_`` names are
configuration, never secrets. A secret goes only over https, unless the entry that binds it
names ``http://`` or the URL's host is loopback: a secret bound to ``host:443`` is not sent
in cleartext to ``http://host:443/``.

Services echo what they got; :func:`redact` and :func:`redact_json` take every declared
secret that is set out of a string or JSON value before it is stored or shown, in the forms
:mod:`orchestration.limits.redaction` knows (best effort: the binding is the guarantee).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestration.core.egress import AllowList, entry_for, host_port, ip_literal
from orchestration.core.errors import PermanentProviderError, ValidationError
from orchestration.core.secret_declarations import CLEARTEXT, split_scheme
from orchestration.limits import redaction

if TYPE_CHECKING:
    from orchestration.core.settings import Settings

MASK = "***"


def _where(url: str) -> str:
    found = host_port(url)
    if found is None:
        return url
    return entry_for(*found)


def _loopback(url: str) -> bool:
    found = host_port(url)
    if found is None:
        return False
    literal = ip_literal(found[0])
    return found[0].lower() == "localhost" if literal is None else literal.is_loopback


def binding_problem(name: str, url: str, settings: Settings) -> str | None:
    """Why secret ``name`` may not be sent to ``url``, or ``None`` when it may.

    Bound by name or IP literal only (no lookup): the connect-time check of
    ``ORCH_PROVIDER_HOSTS`` decides where the name may then lead. Over http only through
    an entry that names ``http://``, or to a loopback host.
    """
    where = _where(url)
    if name.upper().startswith("ORCH_"):
        return f"{name} is configuration, not a secret; name a secret in ORCH_PROVIDER_SECRETS"
    hosts = settings.provider_secrets.get(name)
    if hosts is None:
        example = json.dumps({name: [where]})
        return (
            f"{name} is not declared in ORCH_PROVIDER_SECRETS; the operator declares it with "
            f"the hosts it may be sent to, e.g. ORCH_PROVIDER_SECRETS='{example}'"
        )
    entries = [split_scheme(host) for host in hosts]
    bound = [scheme for scheme, entry in entries if AllowList.of([entry]).permits_url(url)]
    if not bound:
        return (
            f"{name} may be sent only to {', '.join(hosts)}, not to {where}; add {where} to its "
            "hosts in ORCH_PROVIDER_SECRETS, or name another secret"
        )
    if url.lower().startswith("https://") or CLEARTEXT in bound or _loopback(url):
        return None
    return (
        f"{name} may be sent to {where} over https only, not in cleartext to "
        f'{CLEARTEXT}{where}; use https, or declare "{CLEARTEXT}{where}" among its hosts in '
        "ORCH_PROVIDER_SECRETS if cleartext is meant"
    )


def check_bound(name: str, urls: Mapping[str, str], field: str, settings: Settings) -> None:
    """Launch check: ``name`` is declared and bound to every URL it would travel to (the
    mapping is URL field -> URL); ``ValidationError`` on ``field`` otherwise."""
    for url_field, url in urls.items():
        problem = binding_problem(name, url, settings)
        if problem is not None:
            raise ValidationError(field, f"used for {url_field}: {problem}")


def secret_value(name: str, url: str, settings: Settings, what: str) -> str:
    """The secret to send to ``url``, checked again at call time (the operator may have
    changed the declaration since the launch). ``PermanentProviderError`` if unusable."""
    problem = binding_problem(name, url, settings)
    if problem is not None:
        raise PermanentProviderError(f"{what}: {problem}")
    value = os.environ.get(name)
    if not value:
        raise PermanentProviderError(
            f"{what}: the secret {name} is not set in this process's environment"
        )
    return value


def redact(text: str, settings: Settings) -> str:
    """``text`` with every declared secret that is set replaced by ``***`` (a ``prefix``
    stays: ``Bearer s3cret`` becomes ``Bearer ***``), as sent and in the encodings of
    :mod:`orchestration.limits.redaction`."""
    values = [os.environ.get(name, "") for name in settings.provider_secrets]
    if not any(values):
        return text
    return redaction.of(values).apply(text, MASK)


def redact_json(value: Any, settings: Settings) -> Any:
    """``value`` (JSON) with :func:`redact` applied to every string in it, keys included."""
    if isinstance(value, str):
        return redact(value, settings)
    if isinstance(value, list):
        return [redact_json(item, settings) for item in value]
    if isinstance(value, dict):
        return {redact(str(k), settings): redact_json(v, settings) for k, v in value.items()}
    return value
