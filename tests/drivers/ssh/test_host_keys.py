"""Reading a VM's SSH host keys from what its cloud reports (burla.drivers.ssh.host_keys)."""

from __future__ import annotations

import asyncssh
import pytest

from burla.drivers.ssh.host_keys import check_host_key, console_host_keys, fingerprint
from burla.errors import BootstrapFailed
from tests.support.clouds.vm_farms import cloud_init_console


def _key() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()


def test_the_keys_cloud_init_printed_are_read_from_a_console_whatever_its_line_prefixes():
    old, new, ecdsa = _key(), _key(), asyncssh.generate_private_key("ecdsa-sha2-nistp256")
    ecdsa_line = ecdsa.export_public_key().decode().strip()
    amazon = ("ec2: -----BEGIN SSH HOST KEY KEYS-----\n"
              f"ec2: {ecdsa_line} root@ip-10-0-0-1\n"
              f"ec2: {' '.join(new.split()[:2])} root@ip-10-0-0-1\n"
              "ec2: -----END SSH HOST KEY KEYS-----\n")
    console = cloud_init_console(old) + "[ 99.1] reboot: Restarting system\n" + amazon
    assert console_host_keys(console) == [" ".join(ecdsa_line.split()[:2]), " ".join(new.split()[:2])]  # the last
    assert console_host_keys("[    0.000000] Linux version 6.1\n") == []  # not printed yet
    assert console_host_keys("-----BEGIN SSH HOST KEY KEYS-----\nssh-ed25519 AAAA") == []  # cut off mid-block


def test_a_key_the_cloud_does_not_report_is_refused_naming_both_fingerprints():
    reported, presented = _key(), _key()
    check_host_key(reported + " any-comment", [reported], "VM n", "1.2.3.4")  # the same key, another comment
    with pytest.raises(BootstrapFailed) as refused:
        check_host_key(presented, [reported], "VM n", "1.2.3.4")
    assert fingerprint(presented) in str(refused.value) and fingerprint(reported) in str(refused.value)
    assert fingerprint(presented).startswith("ssh-ed25519 SHA256:")


def test_burla_loads_its_ssh_library_without_a_warning_even_where_warnings_are_errors():
    """cryptography 51 warns when asyncssh names its DSA classes; a head's first SSH login must not
    print (or, under -W error, raise) it."""
    import subprocess
    import sys

    code = ("import sys; from burla.drivers.ssh.login import ssh_library; "
            "assert 'asyncssh' not in sys.modules; print(ssh_library().__name__)")
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "asyncssh", done.stderr
    assert done.stderr == ""
