"""Data position that resumes exactly: a resumable sampler and a DataLoader with resumable workers."""
