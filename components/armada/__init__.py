"""Armada (batch scheduler) services, one ComponentResource per file."""
