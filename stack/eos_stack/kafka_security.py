"""The local broker's secured listener: SASL_SSL with SCRAM users, TLS from a local CA, ACLs.

Next to its unauthenticated PLAINTEXT listener (every other test uses it; its principal, ``User:ANONYMOUS``,
is a super user, as is the controller listener's) the broker listens with SASL_SSL on a third loopback
port (``sasl_ssl`` in ``<state>/kafka/ports.json``). Its TLS material is made once with ``openssl`` under
``<state>/kafka/tls``: a CA (``ca.crt``, the file clients trust: ``KAFKA_CA_FILE``) and a server
certificate it signed for ``IP:127.0.0.1, DNS:localhost`` (hostname verification works against
``KAFKA_SECURE_BOOTSTRAP``), in a PEM key store with a PKCS#8 key encrypted by a generated password (Kafka
loads a PEM key store *file* only with ``ssl.key.password``). The ``StandardAuthorizer`` denies whatever no
ACL allows. SCRAM users and ACLs are made through the Admin API on the PLAINTEXT listener; ``up`` makes
the SCRAM super user ``admin``, whose generated password stays in ``<state>/kafka/credentials.json``
(owner-readable only, never logged; :func:`admin_credentials`).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Iterable

from . import kafka_ports
from .common import Stack, StackError, log, require_tool, run
from .node_config import services_ip

LISTENER = "SASL_SSL"
PODS_LISTENER = "PODS_SASL_SSL"   # the same on the services address, for Pods on the real nodes (kafka.py)
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
ADMIN = "admin"
SCRAM_ITERATIONS = 8192  # Kafka's minimum is 4096; SCRAM-SHA-512 allows up to 16384
ENV_KEYS = ["KAFKA_SECURE_BOOTSTRAP", "KAFKA_CA_FILE"]
TIMEOUT = 30.0
OPENSSL_HINT = "Install OpenSSL (Debian: apt-get install openssl); it makes the local broker's TLS material."


# -- files -----------------------------------------------------------------------
def tls_dir(st: Stack) -> Path:
    return kafka_ports.home(st) / "tls"


def ca_file(st: Stack) -> Path:
    """The PEM certificate of the local CA that signed the broker's certificate."""
    return tls_dir(st) / "ca.crt"


def ca_pem(st: Stack) -> str:
    return ca_file(st).read_text()


def keystore_file(st: Stack) -> Path:
    """The broker's PEM key store: its encrypted PKCS#8 key, its certificate, the CA's certificate."""
    return tls_dir(st) / "server-keystore.pem"


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def credentials(st: Stack) -> dict[str, str]:
    """The admin user's password and the server key's password: generated once, owner-readable only."""
    cf = kafka_ports.home(st) / "credentials.json"
    if cf.exists():
        return json.loads(cf.read_text())
    creds = {"admin_user": ADMIN, "admin_password": secrets.token_urlsafe(24),
             "key_password": secrets.token_urlsafe(24)}
    shutil.rmtree(tls_dir(st), ignore_errors=True)  # a key store of another key password cannot be opened
    _write_private(cf, json.dumps(creds))
    return creds


def admin_credentials(st: Stack) -> tuple[str, str]:
    """``(user, password)`` of the SCRAM super user ``admin`` (mechanism SCRAM-SHA-512)."""
    creds = credentials(st)
    return creds["admin_user"], creds["admin_password"]


def secure_port(st: Stack) -> int:
    return kafka_ports.ports(st)["sasl_ssl"]


def secure_bootstrap(st: Stack) -> str:
    return f"127.0.0.1:{secure_port(st)}"


def env(st: Stack) -> dict[str, str]:
    return {"KAFKA_SECURE_BOOTSTRAP": secure_bootstrap(st), "KAFKA_CA_FILE": str(ca_file(st))}


# -- TLS material ----------------------------------------------------------------
CA_CNF = """\
[req]
distinguished_name = dn
x509_extensions = v3_ca
prompt = no
[dn]
CN = eos-stack local Kafka CA
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
"""
SERVER_EXT = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = {san}
authorityKeyIdentifier = keyid
"""


def subject_alt_names(st: Stack) -> str:
    """The names the broker's certificate holds: loopback for this machine's clients, and the stack's services
    address for Pods on the real nodes (the ``PODS_SASL_SSL`` listener advertises it: kafka.py)."""
    return f"IP:127.0.0.1, DNS:localhost, IP:{services_ip(st.state)}"


def ensure_tls(st: Stack) -> Path:
    """Make the CA and the broker's key store once (in a scratch folder, renamed when complete); again when the
    names the certificate must hold changed (a stack made before the Pods' secured listener)."""
    out = tls_dir(st)
    san = subject_alt_names(st)
    made_for = out / "subject-alt-names"
    if ca_file(st).exists() and keystore_file(st).exists() and made_for.exists() and made_for.read_text() == san:
        return out
    openssl = require_tool("openssl", OPENSSL_HINT)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "ca.cnf").write_text(CA_CNF)
    (tmp / "server.ext").write_text(SERVER_EXT.format(san=san))
    days = "3650"

    def ossl(*args: str, env: dict[str, str] | None = None) -> None:
        run([openssl, *args], what=f"openssl {args[0]} (making the Kafka TLS material)", cwd=tmp, env=env,
            timeout=120)

    old = os.umask(0o077)  # keys are born owner-only
    try:
        ossl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", days, "-config", "ca.cnf")
        ossl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=localhost")
        ossl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial",
             str(int.from_bytes(secrets.token_bytes(15), "big")), "-days", days, "-sha256",
             "-extfile", "server.ext", "-out", "server.crt")
        # Kafka reads a PEM key store file only with a key password, and decrypts the key with the
        # algorithm its header names: Java 17 has no SecretKeyFactory for PKCS#5 v2 ("PBES2", OpenSSL's
        # default), so the PKCS#12 scheme PBE-SHA1-3DES (Java: PBEWithSHA1AndDESede). The key's password
        # lies next to it (server.properties) anyway: the encryption is a format, not a protection.
        # The password goes through the environment, not argv (visible in ps).
        ossl("pkcs8", "-topk8", "-in", "server.key", "-out", "server-key.enc.pem", "-v1", "PBE-SHA1-3DES",
             "-passout", "env:EOS_KAFKA_KEY_PASSWORD",
             env={"EOS_KAFKA_KEY_PASSWORD": credentials(st)["key_password"]})
    finally:
        os.umask(old)
    (tmp / "server-keystore.pem").write_text("".join((tmp / f).read_text() for f in
                                                     ("server-key.enc.pem", "server.crt", "ca.crt")))
    for name in ("server.csr", "ca.cnf", "server.ext", "server.key", "server-key.enc.pem"):
        (tmp / name).unlink()
    os.chmod(tmp / "server-keystore.pem", 0o600)
    os.chmod(tmp / "ca.crt", 0o644)
    os.chmod(tmp / "server.crt", 0o644)
    (tmp / "subject-alt-names").write_text(san)
    os.chmod(tmp, 0o755)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"made the Kafka TLS material (a local CA, a server certificate for {san}) in {out}")
    return out


# -- broker configuration --------------------------------------------------------
def broker_props(st: Stack) -> dict[str, str]:
    """The security part of ``server.properties`` (listeners themselves: :func:`eos_stack.kafka.write_config`)."""
    props = {"sasl.enabled.mechanisms": ",".join(MECHANISMS)}
    for listener in (LISTENER, PODS_LISTENER):   # the same users, ACLs and certificate on both
        pre = f"listener.name.{listener.lower()}."
        props.update({
            **{f"{pre}{m.lower()}.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
               "required;" for m in MECHANISMS},
            f"{pre}ssl.keystore.type": "PEM",
            f"{pre}ssl.keystore.location": str(keystore_file(st)),
            f"{pre}ssl.key.password": credentials(st)["key_password"],
            f"{pre}ssl.truststore.type": "PEM",
            f"{pre}ssl.truststore.location": str(ca_file(st)),
            f"{pre}ssl.client.auth": "none",
        })
    props.update({
        # ACLs decide, except for the super users: ANONYMOUS is the principal of the PLAINTEXT and the
        # controller listener (the broker itself, every existing client), admin the SCRAM administrator.
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:ANONYMOUS;User:{ADMIN}",
        "allow.everyone.if.no.acl.found": "false",
    })
    return props


# -- admin API -------------------------------------------------------------------
def _admin(st: Stack):
    """An admin client on the PLAINTEXT listener (super user ANONYMOUS), for a ``with`` block: closed at its
    end, never left to the garbage collector (which may run on the client's own librdkafka thread, and a
    client destroyed there aborts the process)."""
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": kafka_ports.bootstrap(st), "log_level": 0})


def _results(admin, futures: dict, what: str) -> list:
    out = []
    for key, fut in futures.items():
        try:
            out.append(fut.result(timeout=TIMEOUT))
        except Exception as exc:  # noqa: BLE001 - re-raised with what failed
            raise StackError(f"Kafka: {what} failed for {key}: {exc}") from exc
    return out


def _wait(check, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            raise StackError(f"Kafka: timed out after {TIMEOUT:.0f}s waiting for {what}")
        time.sleep(0.2)


def _mechanism(mechanism: str):
    from confluent_kafka.admin import ScramMechanism
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism {mechanism!r}: choose from {MECHANISMS}")
    return ScramMechanism[mechanism.replace("-", "_")]


def user_mechanisms(st: Stack, name: str) -> set[str]:
    """The SCRAM mechanisms user ``name`` has credentials for (empty: no such user)."""
    from confluent_kafka import KafkaError, KafkaException
    with _admin(st) as admin:
        try:
            desc = admin.describe_user_scram_credentials([name])[name].result(timeout=TIMEOUT)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.RESOURCE_NOT_FOUND:
                return set()
            raise
    return {info.mechanism.name.replace("_", "-") for info in desc.scram_credential_infos}


def create_user(st: Stack, name: str, password: str, mechanism: str = "SCRAM-SHA-512") -> None:
    """Create SCRAM user ``name`` or set its password (idempotent); returns once the broker knows it."""
    from confluent_kafka.admin import ScramCredentialInfo, UserScramCredentialUpsertion
    mech = _mechanism(mechanism)
    up = UserScramCredentialUpsertion(name, ScramCredentialInfo(mech, SCRAM_ITERATIONS), password.encode())
    with _admin(st) as admin:
        _results(admin, admin.alter_user_scram_credentials([up]), "creating a SCRAM user")
    _wait(lambda: mechanism in user_mechanisms(st, name), f"SCRAM user {name!r} ({mechanism})")


def delete_user(st: Stack, name: str) -> None:
    """Remove every SCRAM credential of ``name`` (no such user: nothing to do)."""
    from confluent_kafka.admin import UserScramCredentialDeletion
    have = user_mechanisms(st, name)
    if have:
        with _admin(st) as admin:
            _results(admin, admin.alter_user_scram_credentials(
                [UserScramCredentialDeletion(name, _mechanism(m)) for m in sorted(have)]), "deleting a SCRAM user")
        _wait(lambda: not user_mechanisms(st, name), f"SCRAM user {name!r} to be gone")


def ensure_admin(st: Stack) -> None:
    """The SCRAM super user ``admin`` (made once; its credentials live in the broker's metadata)."""
    from confluent_kafka import KafkaException
    user, password = admin_credentials(st)
    try:
        have = user_mechanisms(st, user)
    except KafkaException as exc:
        raise StackError(f"Kafka: could not describe the SCRAM user {user!r} at {kafka_ports.bootstrap(st)}: {exc}") from exc
    if "SCRAM-SHA-512" not in have:
        create_user(st, user, password)
        log(f"Kafka: created the SCRAM super user {user!r} (password in {kafka_ports.home(st)}/credentials.json)")


def _binding(user: str, rtype: str, name: str, op: str, pattern: str = "LITERAL"):
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
    return AclBinding(ResourceType[rtype], name, ResourcePatternType[pattern], f"User:{user}", "*",
                      AclOperation[op], AclPermissionType.ALLOW)


# The group ids of the job's librdkafka consumers (eos-ledger-reader-*, eos-horizon-*, eos-verify-*).
GROUP_PREFIX = "eos-"


def stream_acls(user: str, *, source_topics: Iterable[str], write_topics: Iterable[str], ledger_topic: str,
                transactional_prefix: str, group_prefix: str | None = GROUP_PREFIX) -> list:
    """Exactly the ACLs a stream's clients need, all ALLOW for ``User:<user>`` from any host:

    * each source topic: READ, DESCRIBE, DESCRIBE_CONFIGS (the replay horizon reads retention.ms);
    * each sink and dead-letter topic (``write_topics``): WRITE, DESCRIBE;
    * the ledger topic: READ, WRITE, CREATE (the job creates it), ALTER (it adds partitions when the
      slot count grows), DESCRIBE, DESCRIBE_CONFIGS (it checks the topic is compacted);
    * transactional ids starting with ``transactional_prefix``: WRITE, DESCRIBE;
    * consumer groups starting with ``group_prefix`` (``None``: none): DESCRIBE only. The consumers only
      assign() partitions and never commit, so no READ (no join, no offset commit); but a librdkafka
      consumer must have a group.id and looks its coordinator up (FindCoordinator needs DESCRIBE on the
      group), and without it every poll() also returns GROUP_AUTHORIZATION_FAILED.

    No cluster ACL: since Kafka 3.0 an idempotent producer needs WRITE on some topic, not IDEMPOTENT_WRITE.
    """
    acls = []
    for t in source_topics:
        acls += [_binding(user, "TOPIC", t, op) for op in ("READ", "DESCRIBE", "DESCRIBE_CONFIGS")]
    for t in write_topics:
        acls += [_binding(user, "TOPIC", t, op) for op in ("WRITE", "DESCRIBE")]
    acls += [_binding(user, "TOPIC", ledger_topic, op)
             for op in ("READ", "WRITE", "CREATE", "ALTER", "DESCRIBE", "DESCRIBE_CONFIGS")]
    acls += [_binding(user, "TRANSACTIONAL_ID", transactional_prefix, op, "PREFIXED") for op in ("WRITE", "DESCRIBE")]
    if group_prefix is not None:
        acls.append(_binding(user, "GROUP", group_prefix, "DESCRIBE", "PREFIXED"))
    return list(dict.fromkeys(acls))  # a topic both source and sink: each binding once


def acls(st: Stack, user: str | None = None) -> set:
    """The ACL bindings of ``user`` (``None``: of everyone)."""
    from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType)
    flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{user}" if user else None,
                           None, AclOperation.ANY, AclPermissionType.ANY)
    with _admin(st) as admin:
        return set(admin.describe_acls(flt, request_timeout=TIMEOUT).result(timeout=TIMEOUT))


def grant(st: Stack, bindings: list) -> list:
    """Create ``bindings``; returns once the broker's authorizer has them all."""
    with _admin(st) as admin:
        _results(admin, admin.create_acls(bindings), "creating ACLs")
    _wait(lambda: set(bindings) <= acls(st), f"{len(bindings)} ACLs to take effect")
    return bindings


def grant_stream(st: Stack, user: str, *, source_topics: Iterable[str], write_topics: Iterable[str],
                 ledger_topic: str, transactional_prefix: str, group_prefix: str | None = GROUP_PREFIX) -> list:
    """Grant ``user`` the ACLs of :func:`stream_acls`; returns the bindings made."""
    return grant(st, stream_acls(user, source_topics=source_topics, write_topics=write_topics,
                                 ledger_topic=ledger_topic, transactional_prefix=transactional_prefix,
                                 group_prefix=group_prefix))


def revoke(st: Stack, bindings: list) -> None:
    """Delete exactly ``bindings`` (an AclBinding is also a filter that matches only itself)."""
    from confluent_kafka.admin import AclBindingFilter
    if not bindings:
        return
    filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                b.permission_type) for b in bindings]
    with _admin(st) as admin:
        _results(admin, admin.delete_acls(filters), "deleting ACLs")
    _wait(lambda: not set(bindings) & acls(st), f"{len(bindings)} ACLs to be gone")


def revoke_user(st: Stack, user: str) -> None:
    """Delete every ACL of ``user``."""
    revoke(st, sorted(acls(st, user), key=str))


def client_config(st: Stack, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> dict[str, str]:
    """librdkafka settings of a client of the secured listener (CA file, hostname verification on)."""
    return {"bootstrap.servers": secure_bootstrap(st), "security.protocol": LISTENER, "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password, "ssl.ca.location": str(ca_file(st)),
            "ssl.endpoint.identification.algorithm": "https"}
