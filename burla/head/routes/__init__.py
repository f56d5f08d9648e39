"""The head's web routes: the JSON API, the dashboard and its static pages, the node and job
WebSockets, who may call what, and the views they serve.
"""
