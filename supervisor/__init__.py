"""The host side: the Supervisor service."""
