"""The trainers people use, made resumable by gpukit: `hf` (Hugging Face Trainer), `lightning`. Each
module imports its framework only when used (`pip install gpukit[hf]`, `gpukit[lightning]`)."""
