"""Compute Engine's VPC firewall rules for a cluster: ingress is denied unless a rule allows it,
so nodes get SSH from anywhere (logins take the cluster's key only) and any TCP port from their
own cluster's nodes, and a deployed head its port and SSH
(cloud.google.com/firewall/docs/firewalls). A project need not have the default network's
`default-allow-ssh`: it can be deleted, and custom networks start without it
(cloud.google.com/firewall/docs/firewalls#more_rules_default_vpc)."""

from __future__ import annotations

import re
from typing import Any

NETWORK_TAG = "burla-node"  # every node: what the SSH rule targets
HEAD_NETWORK_TAG = "burla-head"  # the firewall rule opening the head's port targets this tag
_MAX_NAME = 63  # tags and rule names are RFC 1035 labels


def _label(text: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", text.lower())[:_MAX_NAME].rstrip("-")


def peer_tag(cluster_id: str) -> str:
    """One cluster's nodes' network tag: their ports admit the instances carrying it, no other
    cluster's (a rule's source tags match instances' primary addresses in the same network:
    cloud.google.com/firewall/docs/firewalls#sources_for_rules)."""
    return _label(f"{NETWORK_TAG}-{cluster_id}")


def node_rules(network: str, cluster_id: str) -> list[dict[str, Any]]:
    """The rules a cluster's nodes need in `network`, as ex_create_firewall's keyword arguments."""
    peers = peer_tag(cluster_id)
    return [
        {"name": _label(f"burla-nodes-ssh-{network}"), "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
         "source_ranges": ["0.0.0.0/0"], "target_tags": [NETWORK_TAG],
         "description": "burla nodes: SSH from their head"},
        # Rule names are the project's, across networks: the network is in it.
        {"name": _label(f"burla-peers-{cluster_id}-{network}"),
         "allowed": [{"IPProtocol": "tcp", "ports": ["0-65535"]}],
         "source_tags": [peers], "target_tags": [peers],
         "description": "burla nodes: any port between one cluster's nodes"},
    ]


def head_rule(port: int) -> dict[str, Any]:
    return {"name": f"burla-head-{port}", "allowed": [{"IPProtocol": "tcp", "ports": [str(port), "22"]}],
            "source_ranges": ["0.0.0.0/0"], "target_tags": [HEAD_NETWORK_TAG],
            "description": "burla head: https for clients and nodes, SSH for `burla deploy`"}


def create_rules(driver: Any, network: str, rules: list[dict[str, Any]]) -> None:
    """Create each rule unless it exists (made by an earlier boot or deployment)."""
    from libcloud.common.google import ResourceExistsError

    for rule in rules:
        rule = dict(rule)
        try:
            driver.ex_create_firewall(rule.pop("name"), network=network, **rule)
        except ResourceExistsError:
            pass
