"""Backend `ssh`: machines the user already has, reached over SSH (a hosts file)."""
