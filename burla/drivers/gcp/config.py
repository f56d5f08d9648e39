"""Compute Engine settings and credentials: the project, zone and region as gcloud's active
configuration (or the environment) names them, the images nodes boot, and access tokens from
application default credentials (a service-account key, gcloud's ADC file, or the metadata
server)."""

from __future__ import annotations

import configparser
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from burla.errors import CloudSetupError

DEFAULT_IMAGE = "debian-cloud/debian-12"  # PROJECT/FAMILY
# GPU machines boot a Deep Learning VM image, which carries the NVIDIA driver; the
# `install-nvidia-driver` metadata item has such images install it at first boot where they
# don't yet (cloud.google.com/deep-learning-vm/docs/images, .../cli and "NVIDIA driver").
GPU_IMAGE = "deeplearning-platform-release/common-cu128-ubuntu-2204-nvidia-570"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
LOGIN_FIX = "Run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a " \
             "service-account key file."



@dataclass(frozen=True)
class GceConfig:
    driver_name: ClassVar[str] = "gce"  # its entry in burla.drivers.registry
    project: str
    zone: str | None = None  # gcloud's compute/zone; None: the first zone of the region
    region: str | None = None  # gcloud's compute/region, or --region
    endpoint: str | None = None  # CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE
    resource_manager_endpoint: str | None = None  # CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDRESOURCEMANAGER
    billing_endpoint: str | None = None  # CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBILLING (the price catalog)
    image: str = DEFAULT_IMAGE  # PROJECT/FAMILY, or an image selfLink
    gpu_image: str = GPU_IMAGE  # the same, for machines with GPUs
    network: str = "default"
    cluster_id: str = "default"
    bake: bool = True  # BURLA_BAKE_IMAGES=0 turns baked images off (see burla.drivers.bake)

    @classmethod
    def from_environment(cls, environ: dict[str, str], region: str | None, cluster_id: str) -> GceConfig:
        gcloud = gcloud_properties(environ)
        project = (environ.get("GOOGLE_CLOUD_PROJECT") or environ.get("CLOUDSDK_CORE_PROJECT")
                   or gcloud.get(("core", "project")) or credentials_project(environ))
        if not project:
            raise CloudSetupError(
                "No Google Cloud project is set. Run `gcloud config set project PROJECT_ID` (or set "
                "GOOGLE_CLOUD_PROJECT)."
            )
        return cls(
            project=project,
            zone=environ.get("CLOUDSDK_COMPUTE_ZONE") or gcloud.get(("compute", "zone")) or None,
            region=region or environ.get("CLOUDSDK_COMPUTE_REGION") or gcloud.get(("compute", "region")) or None,
            endpoint=environ.get("CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE") or None,
            resource_manager_endpoint=environ.get("CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDRESOURCEMANAGER") or None,
            billing_endpoint=environ.get("CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBILLING") or None,
            image=environ.get("BURLA_GCP_IMAGE") or DEFAULT_IMAGE,
            gpu_image=environ.get("BURLA_GCP_GPU_IMAGE") or GPU_IMAGE,
            network=environ.get("BURLA_GCP_NETWORK") or "default",
            cluster_id=cluster_id, bake=environ.get("BURLA_BAKE_IMAGES") != "0",
        )

    def head_environment(self) -> dict[str, str]:
        """What a deployed head needs to boot nodes like this (its credentials: the VM's service account)."""
        settings = {"GOOGLE_CLOUD_PROJECT": self.project, "CLOUDSDK_COMPUTE_ZONE": self.zone or "",
                    "CLOUDSDK_COMPUTE_REGION": self.region or "", "BURLA_GCP_IMAGE": self.image,
                    "BURLA_GCP_GPU_IMAGE": self.gpu_image, "BURLA_BAKE_IMAGES": "" if self.bake else "0",
                    "BURLA_GCP_NETWORK": self.network, "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": self.endpoint or "",
                    "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDRESOURCEMANAGER": self.resource_manager_endpoint or "",
                    "CLOUDSDK_API_ENDPOINT_OVERRIDES_CLOUDBILLING": self.billing_endpoint or ""}
        return {k: v for k, v in settings.items() if v}


def gcloud_properties(environ: dict[str, str]) -> dict[tuple[str, str], str]:
    """Properties of gcloud's active configuration (read from its files; gcloud need not be installed)."""
    directory = Path(environ.get("CLOUDSDK_CONFIG") or Path(environ.get("HOME", "~")).expanduser() / ".config/gcloud")
    name = environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    if not name:
        try:
            name = (directory / "active_config").read_text().strip() or "default"
        except OSError:
            name = "default"
    parser = configparser.ConfigParser()
    try:
        parser.read(directory / "configurations" / f"config_{name}")
    except configparser.Error:
        return {}
    return {(section, key): value for section in parser.sections() for key, value in parser[section].items()}


def credentials_project(environ: dict[str, str]) -> str | None:
    """The project a service-account key (or ADC file) names, if any."""
    candidates = [environ.get("GOOGLE_APPLICATION_CREDENTIALS")]
    directory = environ.get("CLOUDSDK_CONFIG") or str(Path(environ.get("HOME", "~")).expanduser() / ".config/gcloud")
    candidates.append(os.path.join(directory, "application_default_credentials.json"))
    for path in candidates:
        if not path:
            continue
        try:
            info = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        project = info.get("project_id") or info.get("quota_project_id")
        if project:
            return str(project)
    return None


class GoogleToken:
    """Access tokens from application default credentials, refreshed before they expire. One per
    driver, shared by its threads (google-auth credentials are refreshed under a lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._credentials: Any = None

    def _load(self) -> Any:
        try:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError
        except ImportError:
            raise CloudSetupError("The GCP driver needs google-auth: pip install 'burla[gcp]'.") from None
        try:
            credentials, _ = google.auth.default(scopes=list(SCOPES))
        except DefaultCredentialsError:
            raise CloudSetupError(f"No Google Cloud credentials found. {LOGIN_FIX}") from None
        return credentials

    @property
    def access_token(self) -> str:
        from google.auth.exceptions import RefreshError, TransportError
        from google.auth.transport.requests import Request

        with self._lock:
            if self._credentials is None:
                self._credentials = self._load()
            if not self._credentials.valid:
                try:
                    self._credentials.refresh(Request())
                except RefreshError as e:
                    raise CloudSetupError(f"Google Cloud credentials were refused ({e}). {LOGIN_FIX}") from None
                except TransportError as e:
                    raise CloudSetupError(f"Could not reach Google's token service: {e}") from None
            return self._credentials.token

    @property
    def quota_project(self) -> str | None:
        """The project user credentials bill API calls to (an ADC file's `quota_project_id`)."""
        with self._lock:
            return getattr(self._credentials, "quota_project_id", None)
