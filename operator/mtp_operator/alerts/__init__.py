"""Alertmanager webhook receiver feeding the rollback policy."""
