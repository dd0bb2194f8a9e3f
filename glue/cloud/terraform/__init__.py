"""Backend `terraform`: the user's own root module makes the VMs, with any provider."""
