"""The child agent runtime inside a worker process."""
