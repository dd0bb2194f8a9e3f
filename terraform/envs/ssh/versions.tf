terraform {
  required_version = ">= 1.5"

  required_providers {
    gpukit = {
      source  = "local/gpukit/gpukit"
      version = "~> 0.1"
    }
  }
}
