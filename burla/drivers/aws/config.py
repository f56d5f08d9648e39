"""EC2 settings and credentials: the region, image family, network and endpoints as the
environment names them, and credentials from botocore's chain (environment, shared config and
credentials files, profiles, SSO), kept per profile so temporary ones renew themselves; an
expired SSO session or missing credentials raise `CloudSetupError` naming the command that
fixes it."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any, ClassVar

from burla.drivers.aws.images import DEFAULT_FAMILY, FAMILIES
from burla.errors import CloudSetupError

# What EC2 answers signed with credentials that have expired.
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
EXPIRED_CODES = ("ExpiredToken", "RequestExpired", "ExpiredTokenException")

@dataclass(frozen=True)
class Ec2Config:
    driver_name: ClassVar[str] = "ec2"  # its entry in burla.drivers.registry
    region: str
    endpoint: str | None = None  # AWS_ENDPOINT_URL_EC2 or AWS_ENDPOINT_URL
    iam_endpoint: str | None = None  # AWS_ENDPOINT_URL_IAM or AWS_ENDPOINT_URL (for `burla deploy`)
    quotas_endpoint: str | None = None  # AWS_ENDPOINT_URL_SERVICE_QUOTAS or AWS_ENDPOINT_URL
    sts_endpoint: str | None = None  # AWS_ENDPOINT_URL_STS or AWS_ENDPOINT_URL (`burla cloud check`)
    profile: str | None = None
    ami: str | None = None  # an AMI id (BURLA_AWS_AMI); default: the image family's newest
    image_family: str = DEFAULT_FAMILY  # BURLA_AWS_IMAGE_FAMILY: one of aws.images.FAMILIES
    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    cluster_id: str = "default"
    ssh_user: str | None = None  # BURLA_AWS_SSH_USER; default: the image publisher's login user
    bake: bool = True  # BURLA_BAKE_IMAGES=0 turns baked images off (see burla.drivers.bake)

    @classmethod
    def from_environment(cls, environ: dict[str, str], region: str | None, cluster_id: str) -> Ec2Config:
        endpoint = environ.get("AWS_ENDPOINT_URL_EC2") or environ.get("AWS_ENDPOINT_URL") or None
        groups = tuple(g for g in environ.get("BURLA_AWS_SECURITY_GROUP_IDS", "").split(",") if g)
        family = environ.get("BURLA_AWS_IMAGE_FAMILY") or DEFAULT_FAMILY
        if family not in FAMILIES:
            raise CloudSetupError(f"BURLA_AWS_IMAGE_FAMILY={family!r} is not one of {', '.join(FAMILIES)}.")
        return cls(
            region=region or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            endpoint=endpoint, profile=environ.get("AWS_PROFILE") or None,
            iam_endpoint=environ.get("AWS_ENDPOINT_URL_IAM") or environ.get("AWS_ENDPOINT_URL") or None,
            quotas_endpoint=environ.get("AWS_ENDPOINT_URL_SERVICE_QUOTAS") or environ.get("AWS_ENDPOINT_URL") or None,
            sts_endpoint=environ.get("AWS_ENDPOINT_URL_STS") or environ.get("AWS_ENDPOINT_URL") or None,
            ami=environ.get("BURLA_AWS_AMI") or None, image_family=family,
            subnet_id=environ.get("BURLA_AWS_SUBNET_ID") or None, security_group_ids=groups, cluster_id=cluster_id,
            ssh_user=environ.get("BURLA_AWS_SSH_USER") or None, bake=environ.get("BURLA_BAKE_IMAGES") != "0",
        )

    def head_environment(self) -> dict[str, str]:
        """What a deployed head needs to boot nodes like this (its credentials: the VM's role)."""
        settings = {"AWS_DEFAULT_REGION": self.region, "BURLA_AWS_AMI": self.ami or "",
                    "BURLA_AWS_SUBNET_ID": self.subnet_id or "",
                    "BURLA_AWS_SECURITY_GROUP_IDS": ",".join(self.security_group_ids),
                    "BURLA_AWS_SSH_USER": self.ssh_user or "",
                    "BURLA_AWS_IMAGE_FAMILY": self.image_family if self.image_family != DEFAULT_FAMILY else "",
                    "BURLA_BAKE_IMAGES": "" if self.bake else "0",
                    # AWS-compatible endpoints the deploying machine uses, the head uses too.
                    "AWS_ENDPOINT_URL_EC2": self.endpoint or "", "AWS_ENDPOINT_URL_IAM": self.iam_endpoint or "",
                    "AWS_ENDPOINT_URL_SERVICE_QUOTAS": self.quotas_endpoint or "",
                    "AWS_ENDPOINT_URL_STS": self.sts_endpoint or ""}
        return {k: v for k, v in settings.items() if v}


# (profile, the AWS_* environment and HOME) -> botocore's credentials, refreshable ones renewing themselves
_chains: dict[tuple, Any] = {}
_chains_lock = threading.Lock()


def login_command(config: Ec2Config) -> str:
    return f"aws sso login --profile {config.profile}" if config.profile else "aws sso login"


def resolve_credentials(config: Ec2Config) -> tuple[str, str, str | None]:
    """(access key, secret key, session token) from botocore's credential chain, as of now: the
    chain is kept per profile, so temporary credentials (SSO, assumed roles, instance roles)
    renew themselves as they near expiry, and a head that lives for days keeps working."""
    import botocore.exceptions
    import botocore.session

    login = login_command(config)
    key = (config.profile, os.environ.get("HOME"),
           *sorted((name, value) for name, value in os.environ.items() if name.startswith("AWS_")))
    try:
        with _chains_lock:
            credentials = _chains.get(key)
            if credentials is None:
                credentials = botocore.session.Session(profile=config.profile).get_credentials()
    except botocore.exceptions.ProfileNotFound as e:
        raise CloudSetupError(f"{e}. List profiles with `aws configure list-profiles`, or unset AWS_PROFILE.") from None
    except botocore.exceptions.SSOTokenLoadError:
        raise CloudSetupError(f"The AWS SSO session has expired. Run `{login}` and try again.") from None
    if credentials is None:
        raise CloudSetupError(
            "No AWS credentials found. Run `aws configure` (access keys) or `aws sso login` (SSO), or set "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."
        )
    try:
        frozen = credentials.get_frozen_credentials()
    except (botocore.exceptions.SSOTokenLoadError, botocore.exceptions.UnauthorizedSSOTokenError):
        raise CloudSetupError(f"The AWS SSO session has expired. Run `{login}` and try again.") from None
    except (botocore.exceptions.TokenRetrievalError, botocore.exceptions.CredentialRetrievalError) as e:
        raise CloudSetupError(f"The AWS credentials could not be renewed ({e}). Run `{login}` and try "
                              "again.") from None
    with _chains_lock:
        _chains[key] = credentials  # kept only once it has given credentials
    return frozen.access_key, frozen.secret_key, frozen.token
