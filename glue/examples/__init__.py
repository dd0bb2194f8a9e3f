"""Reference trainers that use glue.train."""
