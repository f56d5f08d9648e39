"""AWS: the EC2 driver, its settings and credentials, machine types, images, quotas, checks and baked AMIs."""
