"""Google Cloud: the Compute Engine driver, its settings and credentials, machine types, prices,
firewall, permissions and baked images.
"""
