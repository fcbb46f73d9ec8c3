"""Optional message signing (``ORCH_SECURITY_*``): signed chains run; an unsigned message,
even valid JSON for a real run, is refused by the worker and moves nothing."""

from __future__ import annotations

import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from orchestration.runtime.processes import ManagedProcess
from orchestration.service import Orchestrator, is_terminal
from tests.conftest import wait_for
from tests.integration.conftest import Stack
from tests.integration.test_security import WORKFLOW, send_raw, written_not_sent

pytestmark = pytest.mark.integration


def _self_signed(folder: Path) -> tuple[Path, Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "orchestration-test")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    store = folder / "store"
    store.mkdir()
    key_path, cert_path = folder / "worker.key", store / "worker.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path, store


_KEY, _CERT, _STORE = _self_signed(Path(tempfile.mkdtemp(prefix="orch-signing-")))
STACK_SETTINGS = {
    "ORCH_SECURITY_KEY": str(_KEY),
    "ORCH_SECURITY_CERTIFICATE": str(_CERT),
    "ORCH_SECURITY_CERT_STORE": str(_STORE),
}


def test_signed_chain_runs_to_completion(
    worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run = orch.launch(WORKFLOW, owner=owner)
    done = wait_for(
        lambda: (r := orch.get(run.id, owner=owner)) and is_terminal(r) and r,
        30,
        what="completion",
    )
    assert done.status == "completed"


def test_unsigned_message_is_refused(
    stack: Stack, worker: ManagedProcess, orch: Orchestrator, owner: str
) -> None:
    run_id = written_not_sent(stack, owner)
    send_raw(stack, run_id, "json")
    wait_for(
        lambda: "Refusing to deserialize untrusted content of type json" in worker.log(),
        20,
        what="the worker's refusal",
    )
    record = orch.get(run_id, owner=owner)
    assert (record.status, record.steps[0].polls) == ("queued", 0)
