"""HTTP plumbing shared by head, node and client: TLS certificates and pinning, token and session
auth with login links, strict JSON bodies, the connection guard, and importing aiohttp cheaply."""
