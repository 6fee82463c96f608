"""Kubernetes and metrics I/O: the API client wrapper, scraping a pod's /metrics, and the
operator's own Prometheus counters. No decisions here; callers pass what to read or write.
"""
