"""The cluster: its state (state.py, depended on by runs) and its lifecycle (lifecycle.py, above runs)."""
