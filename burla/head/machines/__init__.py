"""The machines a head keeps: the fleet that boots and deletes them, the cluster settings, grow's plans
and the machine catalogs.
"""
