# The terraform backend: your own root module (`glue up --backend terraform --module DIR`) makes the VMs
# with any provider. gpukit calls it from its own working dir in the kit home; glue writes the module's
# absolute path in place of the placeholder below (glue/infra/user_module.py), so your module's own
# relative paths (path.module, ../modules/...) keep working. What it must take and emit:
# docs/guides/own-terraform.md.
module "user" {
  source = "GPUKIT_USER_MODULE"

  vm_count       = var.vm_count
  name_prefix    = var.name_prefix
  ssh_public_key = var.ssh_public_key
}
