"""The head's history: its SQLite schema, the writer thread, the queries, what the cluster records as
things happen, and usage read from it.
"""
