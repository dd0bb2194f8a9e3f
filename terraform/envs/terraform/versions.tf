# Your module declares its own providers (any of them); gpukit's CLI config installs them as terraform
# would, and gpukit's own provider from the kit's local mirror.
terraform {
  required_version = ">= 1.5"
}
