"""Scheduling as pure state: the records of nodes and jobs, the scheduler, eligibility, pushes, steals,
retries, and where each input is.
"""
