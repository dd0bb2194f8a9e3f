terraform {
  required_version = ">= 1.9" # cross-variable validation

  required_providers {
    gpukit = {
      source  = "local/gpukit/gpukit"
      version = "~> 0.1"
    }
  }
}
