"""`burla cloud check` against the stand-in clouds: what it verifies, what it says when something
is missing, and its exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO


def _check(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "burla", "cloud", "check", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=120, env=env or dict(os.environ))


def _by_name(done: subprocess.CompletedProcess) -> dict[str, dict]:
    document = json.loads(done.stdout)
    return {c["name"]: c for c in document["data"]["checks"]}


def test_an_aws_account_that_allows_everything_passes(moto, tmp_path):
    env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
    done = _check("--cloud", "aws", "--json", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    checks = _by_name(done)
    assert [c["status"] for c in checks.values()] == ["ok"] * 7
    assert "arn:aws:sts::123456789012:user/moto" in checks["credentials"]["detail"]
    assert checks["image"]["detail"].startswith("al2023-ami-2023")
    assert "Running On-Demand Standard" in checks["vCPU quota"]["detail"] and "room for 4 m7i.2xlarge" in checks[
        "vCPU quota"]["detail"]
    # The lines a person reads: one per check.
    lines = _check("--cloud", "aws", env=env)
    assert lines.returncode == 0 and lines.stdout.splitlines()[0] == "burla cloud check: aws"
    assert any(line.startswith("ok    permissions") for line in lines.stdout.splitlines())


def test_a_missing_permission_and_a_small_quota_are_named_with_their_fixes(moto, ec2_rules, tmp_path):
    ec2_rules.denied |= {"ec2:RunInstances"}
    ec2_rules.vcpu_quotas["L-1216C47A"] = 4  # one m7i.2xlarge needs 8
    env = dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path))
    done = _check("--cloud", "aws", "--json", env=env)
    assert done.returncode == 9, done.stdout + done.stderr  # booting would fail
    checks = _by_name(done)
    assert checks["permissions"]["status"] == "fail" and "ec2:RunInstances" in checks["permissions"]["detail"]
    assert "ec2:TerminateInstances" not in checks["permissions"]["detail"]
    assert checks["vCPU quota"]["status"] == "fail"
    assert "--quota-code L-1216C47A" in checks["vCPU quota"]["fix"]
    lines = _check("--cloud", "aws", env=env).stdout
    assert "fail  permissions" in lines and "fix: allow these actions" in lines


def test_an_unreadable_quota_is_a_warning_naming_the_permission(moto, ec2_rules, tmp_path):
    ec2_rules.denied |= {"servicequotas:GetServiceQuota"}
    done = _check("--cloud", "aws", "--json", env=dict(os.environ, BURLA_CONFIG_DIR=str(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    quota = _by_name(done)["vCPU quota"]
    assert quota["status"] == "warn" and quota["fix"] == "allow servicequotas:GetServiceQuota"


def test_no_credentials_fail_first_and_say_how_to_sign_in(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(HOME=str(tmp_path), BURLA_CONFIG_DIR=str(tmp_path), AWS_EC2_METADATA_DISABLED="true")
    done = _check("--cloud", "aws", "--json", env=env)
    assert done.returncode == 9
    [credentials] = json.loads(done.stdout)["data"]["checks"]
    assert credentials["status"] == "fail" and "aws configure" in credentials["detail"]


def test_no_cloud_configured_is_bad_usage_naming_the_command(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "CLOUDSDK_"))}
    env.update(HOME=str(tmp_path), BURLA_CONFIG_DIR=str(tmp_path))
    done = _check("--json", env=env)
    assert done.returncode == 2
    assert "burla config set cloud" in json.loads(done.stdout)["error"]["message"]
