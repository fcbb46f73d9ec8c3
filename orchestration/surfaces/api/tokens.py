"""API tokens: bearer tokens that map to an owner, stored only as their SHA-256.

A token is 32 random bytes (``orch_`` + URL-safe base64); it is printed once when created and
never stored, so a leaked database does not leak working credentials. The hash is the primary
key: a lookup is one index probe, and a high-entropy token needs no slow hash.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from sqlalchemy import inspect, select
from sqlalchemy.orm import Session

from orchestration.core.db import get_engine
from orchestration.core.errors import DatabaseNotReady, ValidationError
from orchestration.core.models import ApiToken
from orchestration.runs.launching import check_name
from orchestration.runtime import readiness

#: Every token starts with this, so a secret scanner can recognise one.
PREFIX = "orch_"
#: Shortest hash prefix ``revoke`` accepts as a token id.
MIN_ID_LENGTH = 8


def hash_token(token: str) -> str:
    """The stored form of ``token``."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_ready(url: str) -> None:
    """Raise :class:`DatabaseNotReady` when the ``api_tokens`` migration has not run (or the
    SQLite file is not there: it is not created)."""
    readiness.require_database(url)
    if not inspect(get_engine(url)).has_table(ApiToken.__tablename__):
        raise DatabaseNotReady(
            "the database has no api_tokens table; run `orchestration db upgrade` first"
        )


def create(
    session: Session, owner: str | None, name: str | None, *, now: datetime, operator: bool = False
) -> str:
    """Store a new token for ``owner`` (an operator's: no owner, a ``name`` required) and
    return it (the only time it is ever visible)."""
    if operator:
        if owner:
            raise ValidationError("owner", "an operator token acts as no owner; leave it out")
        if not name:
            raise ValidationError("name", "an operator token needs a name: the journal shows it")
    else:
        check_name("owner", owner or "")
    if name is not None and not 1 <= len(name) <= 200:
        raise ValidationError("name", "must be 1-200 characters")
    token = PREFIX + secrets.token_urlsafe(32)
    session.add(
        ApiToken(
            token_hash=hash_token(token),
            owner="" if operator else owner,
            name=name,
            created_at=now,
            operator=operator,
        )
    )
    return token


def holder_of(session: Session, token: str) -> ApiToken | None:
    """The live token row of ``token``, or ``None`` if it is unknown or revoked."""
    row = session.get(ApiToken, hash_token(token))
    if row is None or row.revoked_at is not None:
        return None
    return row


def owner_for(session: Session, token: str) -> str | None:
    """The owner ``token`` acts as, or ``None`` if it is unknown, revoked or an operator's."""
    row = holder_of(session, token)
    return None if row is None or row.operator else row.owner


def listing(session: Session, owner: str | None = None) -> list[ApiToken]:
    """Tokens (all, or one owner's), oldest first; the id shown is a hash prefix."""
    query = select(ApiToken).order_by(ApiToken.created_at, ApiToken.token_hash)
    if owner is not None:
        query = query.where(ApiToken.owner == owner)
    return list(session.scalars(query).all())


def revoke(session: Session, token_or_id: str, *, now: datetime) -> ApiToken:
    """Revoke a token given itself or its id (a hash prefix of at least 8 characters).

    Idempotent: revoking a revoked token keeps its first ``revoked_at``. Raises
    :class:`ValidationError` when nothing, or more than one token, matches.
    """
    if token_or_id.startswith(PREFIX):
        rows = [row] if (row := session.get(ApiToken, hash_token(token_or_id))) else []
    elif len(token_or_id) >= MIN_ID_LENGTH and all(c in "0123456789abcdef" for c in token_or_id):
        rows = list(
            session.scalars(
                select(ApiToken).where(ApiToken.token_hash.startswith(token_or_id)).limit(2)
            ).all()
        )
    else:
        raise ValidationError(
            "token", f"give the token itself or its id (at least {MIN_ID_LENGTH} hex characters)"
        )
    if len(rows) != 1:
        problem = "no token matches" if not rows else "several tokens match; give a longer id"
        raise ValidationError("token", problem)
    row = rows[0]
    if row.revoked_at is None:
        row.revoked_at = now
    return row
