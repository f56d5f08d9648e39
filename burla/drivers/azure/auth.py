"""Azure credentials: Resource Manager tokens for a service principal, the Azure CLI's login or
a VM's managed identity, and the Azure CLI's defaults (subscription, location)."""

from __future__ import annotations

import configparser
import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Protocol

from burla.errors import CloudSetupError

_SP_FIX = ("Check AZURE_CLIENT_ID, AZURE_CLIENT_SECRET and AZURE_TENANT_ID, or create a new secret with "
           "`az ad sp credential reset --id $AZURE_CLIENT_ID`.")


class AzureLogin(Protocol):
    """What a token is asked for with (the driver's AzureConfig, frozen: read-only here)."""

    @property
    def managed_identity(self) -> bool: ...
    @property
    def client_id(self) -> str | None: ...
    @property
    def client_secret(self) -> str | None: ...
    @property
    def tenant_id(self) -> str | None: ...
    @property
    def authority(self) -> str: ...
    @property
    def arm_endpoint(self) -> str: ...
    @property
    def imds_endpoint(self) -> str: ...
    @property
    def subscription_id(self) -> str: ...


def cli_default_subscription(directory: Path) -> dict[str, Any]:
    """The Azure CLI's default subscription (`az account show`), read from its profile file."""
    try:
        profile = json.loads((directory / "azureProfile.json").read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return {}
    return next((s for s in profile.get("subscriptions", []) if s.get("isDefault")), {})


def cli_default(directory: Path, name: str) -> str | None:
    parser = configparser.ConfigParser()
    try:
        parser.read(directory / "config")
    except configparser.Error:
        return None
    return parser.get("defaults", name, fallback=None) or None


class AzureToken:
    """Resource Manager access tokens for a service principal or the Azure CLI's login, renewed
    five minutes before they expire. One per driver, shared by its threads."""

    def __init__(self, config: AzureLogin) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._token: tuple[str, float] | None = None

    def get(self) -> tuple[str, float]:
        with self._lock:
            if self._token is None or time.time() + 300 >= self._token[1]:
                if self.config.managed_identity:
                    self._token = self._managed_identity()
                else:
                    self._token = self._service_principal() if self.config.client_id else self._cli()
            return self._token

    def _service_principal(self) -> tuple[str, float]:
        c = self.config
        form = urllib.parse.urlencode({
            "grant_type": "client_credentials", "client_id": c.client_id, "client_secret": c.client_secret,
            "scope": f"{c.arm_endpoint}/.default",
        }).encode()
        request = urllib.request.Request(f"{c.authority}/{c.tenant_id}/oauth2/v2.0/token", data=form, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read()).get("error_description", "").splitlines()[0]
            except (ValueError, IndexError):
                detail = f"HTTP {e.code}"
            raise CloudSetupError(f"Azure refused the service principal ({detail}). {_SP_FIX}") from None
        except (urllib.error.URLError, OSError) as e:
            raise CloudSetupError(f"Could not reach Azure's login service at {c.authority}: {e}") from None
        return answer["access_token"], time.time() + float(answer.get("expires_in", 3600))

    def _managed_identity(self) -> tuple[str, float]:
        """The VM's own identity, from the instance metadata service (a deployed head)."""
        query = urllib.parse.urlencode({"api-version": "2018-02-01", "resource": f"{self.config.arm_endpoint}/"})
        request = urllib.request.Request(f"{self.config.imds_endpoint}/metadata/identity/oauth2/token?{query}",
                                         headers={"Metadata": "true"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise CloudSetupError(f"This VM's managed identity gave no token ({e}); is a system-assigned identity "
                                  "enabled with a role on the resource group?") from None
        return answer["access_token"], float(answer["expires_on"])

    def _cli(self) -> tuple[str, float]:
        az = shutil.which("az")
        if az is None:
            raise CloudSetupError(
                "No Azure credentials: install the Azure CLI and run `az login`, or set AZURE_CLIENT_ID, "
                "AZURE_CLIENT_SECRET and AZURE_TENANT_ID for a service principal."
            )
        command = [az, "account", "get-access-token", "--resource", f"{self.config.arm_endpoint}/", "--subscription",
                   self.config.subscription_id, "--output", "json"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise CloudSetupError("`az account get-access-token` did not answer within 60 s.") from None
        if done.returncode != 0:
            message = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
            if "az login" in done.stderr:
                raise CloudSetupError(f"The Azure CLI's login has expired or is missing ({message}). Run `az login`.")
            raise CloudSetupError(f"`az account get-access-token` failed: {message}")
        answer = json.loads(done.stdout)
        expires = answer.get("expires_on")
        if expires is None:  # older CLIs give only local time
            expires = time.mktime(time.strptime(answer["expiresOn"].split(".")[0], "%Y-%m-%d %H:%M:%S"))
        return answer["accessToken"], float(expires)
