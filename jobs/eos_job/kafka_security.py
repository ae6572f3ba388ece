"""Kafka connection security of a stream's two ends, ``source`` and ``sink``: SASL and TLS.

The spec names Secrets only (``credentials``: a SASL mechanism with username and password keys; ``tls``:
a CA and optionally a client certificate and key). The values reach a client in one of two ways, never
through the spec, a ConfigMap, status or a log line:

* in the stream's Pods, as environment variables the operator fills by ``secretKeyRef`` (``env_name``);
* in the operator, from the Secrets it reads by name in the stream's namespace (``KafkaSecrets``).

From those, ``librdkafka_config`` makes the settings of the Python clients (ledger, slot producers,
fencing, horizon) and ``java_config`` those of Spark's Kafka source (kafka-clients, PEM given inline).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal, Mapping

from pydantic import Field, model_validator

from .model import Model

End = Literal["source", "sink"]
# The env variable suffix of each Secret value an end may need.
VALUES = {"username": "SASL_USERNAME", "password": "SASL_PASSWORD", "ca": "SSL_CA_PEM",
          "certificate": "SSL_CERT_PEM", "key": "SSL_KEY_PEM", "key_password": "SSL_KEY_PASSWORD"}


class SecretKeyRef(Model):
    name: str = Field(..., min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
                      description="Secret name in the stream's namespace.")
    key: str = Field(..., min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$",
                     description="Key within the Secret.")


class KafkaCredentials(Model):
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field("PLAIN", description=(
        "SASL mechanism."))
    security_protocol: Literal["SASL_PLAINTEXT", "SASL_SSL"] = Field("SASL_SSL", description=(
        "Kafka security.protocol: SASL_SSL (TLS, see tls for a private CA) or SASL_PLAINTEXT."))
    username: SecretKeyRef = Field(..., description="Secret key holding the SASL username.")
    password: SecretKeyRef = Field(..., description="Secret key holding the SASL password.")


class KafkaTls(Model):
    ca: SecretKeyRef | None = Field(None, description=(
        "Secret key holding the PEM CA certificate(s) that signed the brokers' certificates; unset: the "
        "system's trust store."))
    certificate: SecretKeyRef | None = Field(None, description=(
        "Secret key holding the client's PEM certificate (mutual TLS); requires key."))
    key: SecretKeyRef | None = Field(None, description="Secret key holding the client's PEM private key.")
    key_password: SecretKeyRef | None = Field(None, description=(
        "Secret key holding the password of an encrypted private key."))

    @model_validator(mode="after")
    def _pairs(self) -> "KafkaTls":
        if (self.certificate is None) != (self.key is None):
            raise ValueError("tls.certificate and tls.key go together (mutual TLS): set both or neither")
        if self.key_password is not None and self.key is None:
            raise ValueError("tls.keyPassword needs tls.key")
        return self


def end_errors(end: End, credentials: KafkaCredentials | None, tls: KafkaTls | None) -> list[str]:
    """What does not fit together at one end (the field named)."""
    if credentials is not None and tls is not None and credentials.security_protocol == "SASL_PLAINTEXT":
        return [f"{end}.tls: set, but {end}.credentials.securityProtocol is SASL_PLAINTEXT (no TLS); "
                "use SASL_SSL or drop tls"]
    return []


def secret_refs(credentials: KafkaCredentials | None, tls: KafkaTls | None) -> dict[str, SecretKeyRef]:
    """The Secret keys an end needs, by value name (``VALUES``)."""
    refs: dict[str, SecretKeyRef] = {}
    if credentials is not None:
        refs.update(username=credentials.username, password=credentials.password)
    if tls is not None:
        refs.update({k: v for k, v in (("ca", tls.ca), ("certificate", tls.certificate), ("key", tls.key),
                                       ("key_password", tls.key_password)) if v is not None})
    return refs


def env_name(end: End, value: str) -> str:
    return f"EOS_{end.upper()}_{VALUES[value]}"


@dataclass(frozen=True)
class KafkaSecrets:
    """The Secret values of one end, held in memory only (never printed: no repr of the values)."""
    values: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_env(cls, end: End, env: Mapping[str, str] | None = None) -> "KafkaSecrets":
        env = os.environ if env is None else env
        return cls({v: env[env_name(end, v)] for v in VALUES if env.get(env_name(end, v))})


class KafkaSecretMissing(RuntimeError):
    """A value the spec references is not there (env in a Pod, Secret key in the operator)."""


def _need(end: End, secrets: KafkaSecrets, value: str) -> str:
    got = secrets.values.get(value)
    if not got:
        raise KafkaSecretMissing(f"{end}: the {value.replace('_', ' ')} the spec references is missing "
                                 f"(environment variable {env_name(end, value)} in the stream's Pods, set by the "
                                 "operator from the Secret; check the Secret and its key exist)")
    return got


def protocol(credentials: KafkaCredentials | None, tls: KafkaTls | None) -> str | None:
    if credentials is not None:
        return credentials.security_protocol
    return "SSL" if tls is not None else None


def librdkafka_config(end: End, credentials: KafkaCredentials | None, tls: KafkaTls | None,
                      secrets: KafkaSecrets) -> dict[str, str]:
    """Settings of a confluent-kafka (librdkafka) client of this end."""
    proto = protocol(credentials, tls)
    if proto is None:
        return {}
    conf = {"security.protocol": proto}
    if credentials is not None:
        conf.update({"sasl.mechanism": credentials.mechanism, "sasl.username": _need(end, secrets, "username"),
                     "sasl.password": _need(end, secrets, "password")})
    if tls is not None:
        conf["ssl.endpoint.identification.algorithm"] = "https"
        if tls.ca is not None:
            conf["ssl.ca.pem"] = _need(end, secrets, "ca")
        if tls.certificate is not None:
            conf["ssl.certificate.pem"] = _need(end, secrets, "certificate")
            conf["ssl.key.pem"] = _need(end, secrets, "key")
        if tls.key_password is not None:
            conf["ssl.key.password"] = _need(end, secrets, "key_password")
    return conf


def java_config(end: End, credentials: KafkaCredentials | None, tls: KafkaTls | None,
                secrets: KafkaSecrets) -> dict[str, str]:
    """Settings of a kafka-clients (Java) client of this end, e.g. Spark's source (prefix them with
    ``kafka.``); PEM material inline, so nothing is written to disk."""
    proto = protocol(credentials, tls)
    if proto is None:
        return {}
    conf = {"security.protocol": proto}
    if credentials is not None:
        module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if credentials.mechanism == "PLAIN"
                  else "org.apache.kafka.common.security.scram.ScramLoginModule")
        user, password = _need(end, secrets, "username"), _need(end, secrets, "password")
        conf.update({"sasl.mechanism": credentials.mechanism,
                     "sasl.jaas.config": f'{module} required username="{_jaas(user)}" password="{_jaas(password)}";'})
    if tls is not None:
        conf["ssl.endpoint.identification.algorithm"] = "https"
        if tls.ca is not None:
            conf.update({"ssl.truststore.type": "PEM", "ssl.truststore.certificates": _need(end, secrets, "ca")})
        if tls.certificate is not None:
            conf.update({"ssl.keystore.type": "PEM",
                         "ssl.keystore.certificate.chain": _need(end, secrets, "certificate"),
                         "ssl.keystore.key": _need(end, secrets, "key")})
        if tls.key_password is not None:
            conf["ssl.key.password"] = _need(end, secrets, "key_password")
    return conf


def _jaas(value: str) -> str:
    """A value inside a JAAS double-quoted string."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def denial(exc: BaseException | None) -> str | None:
    """The status reason when ``exc`` (or what caused it) is Kafka refusing access: KafkaSecretMissing,
    KafkaAuthenticationFailed (a wrong user or password, a TLS handshake) or KafkaAuthorizationFailed (an
    ACL); None for anything else (a broker down is retried by the restart strategy)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, KafkaSecretMissing):
            return "KafkaSecretMissing"
        text = str(exc).lower()
        if "authentication" in text or "ssl handshake failed" in text:
            return "KafkaAuthenticationFailed"
        if "authorization failed" in text or "authorization_failed" in text:
            return "KafkaAuthorizationFailed"
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None
