"""Where nodes run: the driver interface, the local driver, the cloud drivers (EC2, GCE, Azure) and
how the head reaches and sets up their VMs over SSH, and deploying a head VM."""
