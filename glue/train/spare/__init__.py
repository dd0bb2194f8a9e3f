"""What an idle spare holds ready for the next attempt: the live runs' environments and warm trainer
processes (arm).
"""
